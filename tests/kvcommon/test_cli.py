"""kvcommon.cli: one-line errors with exit code 2, run(main), list flags."""
import argparse

import pytest

from kvcommon.cli import OneLineParser, csv_list, error_line, positive_int, run


def test_parser_error_is_one_line_and_exit_2(capsys):
    parser = OneLineParser(prog="tool")
    parser.add_argument("--n", type=int)
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["--n", "x"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: argument --n: invalid int value: 'x'") and err.endswith("(see --help)\n")
    assert err.count("\n") == 1


@pytest.mark.parametrize("error, code", [(ValueError("bad value\nsecond line"), 2), (FileNotFoundError("gone"), 2),
                                         (KeyError("key"), 2), (KeyboardInterrupt(), 130)])
def test_run_turns_user_errors_into_one_line(capsys, error, code):
    def main(argv):
        raise error
    assert run(main, []) == code
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert "second line" not in err


def test_run_passes_exit_codes_and_bugs_through():
    assert run(lambda argv: None) == 0
    assert run(lambda argv: 3) == 3

    def bug(argv):
        raise RuntimeError("a bug is a traceback")
    with pytest.raises(RuntimeError):
        run(bug)


def test_error_line_names_the_key_and_empty_messages():
    assert error_line(KeyError("h100")) == "h100"
    assert error_line(ValueError()) == "ValueError"


def test_csv_list_and_positive_int():
    assert csv_list(int, "--batch")("1, 8,32") == [1, 8, 32]
    with pytest.raises(argparse.ArgumentTypeError, match="--batch: empty list"):
        csv_list(int, "--batch")(" , ")
    with pytest.raises(argparse.ArgumentTypeError, match="comma-separated"):
        csv_list(int, "--batch")("1,x")
    assert positive_int("3") == 3
    for bad in ("0", "-1", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            positive_int(bad)
