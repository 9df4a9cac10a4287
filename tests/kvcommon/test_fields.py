"""kvcommon.fields: one declaration per parameter generates the library check and the CLI flag."""
from dataclasses import dataclass

import pytest

from kvcommon.cli import OneLineParser
from kvcommon.fields import FieldError, above, add_flags, at_least, flag_of, from_args, in_range, one_of, param, validate


@dataclass(frozen=True)
class Options:
    name: str = param(help="a name")
    ratio: float = param(0.5, help="a ratio", check=in_range(0, 1, low_open=True))
    sizes: tuple[int, ...] = param((1, 8), help="sizes", check=at_least(1), list=True, flag="--size")
    mode: str = param("a", help="a mode", choices=("a", "b"))
    upper: str = param("x", help="normalised", convert=str.lower)

    def __post_init__(self):
        validate(self)


def test_checks_name_the_field():
    with pytest.raises(FieldError, match=r"^ratio must be in \(0, 1\], got 1.5$") as exc:
        Options("n", ratio=1.5)
    assert (exc.value.field, exc.value.value) == ("ratio", 1.5)
    with pytest.raises(FieldError, match=r"^sizes must be >= 1, got 0$"):
        Options("n", sizes=(4, 0))
    with pytest.raises(FieldError, match=r"^mode must be one of a, b, got 'c'$"):
        Options("n", mode="c")
    assert Options("n", upper="ABC").upper == "abc"


def test_check_phrases():
    assert in_range(0, 1)(0) is None and in_range(0, 1, low_open=True)(0) == "must be in (0, 1]"
    assert in_range(0, 1, high_open=True)(1) == "must be in [0, 1)"
    assert above(0)(0) == "must be > 0" and above(0)(1e-9) is None
    assert one_of(("x",))("y") == "must be one of x"


def parser(**kwargs):
    p = OneLineParser(prog="tool")
    add_flags(p, Options, ["name", "ratio", "sizes", "mode"], **kwargs)
    return p


def test_flags_from_fields():
    args = parser().parse_args(["--name", "n", "--size", "2,4"])
    assert vars(args) == {"name": "n", "ratio": 0.5, "sizes": [2, 4], "mode": "a"}
    options = from_args(Options, args)
    assert options == Options("n", 0.5, (2, 4), "a")
    assert flag_of(Options, "sizes") == "--size" and flag_of(Options, "ratio") == "--ratio"
    help_text = parser().format_help()
    assert "a ratio" in help_text and "{a,b}" in help_text


def test_cli_errors_name_the_flag():
    with pytest.raises(ValueError, match=r"^--ratio must be in \(0, 1\], got 1.5$"):
        from_args(Options, parser().parse_args(["--name", "n", "--ratio", "1.5"]))
    with pytest.raises(ValueError, match=r"^--size must be >= 1, got 0$"):
        from_args(Options, parser().parse_args(["--name", "n", "--size", "0"]))


def test_bad_flag_text_is_one_line(capsys):
    with pytest.raises(SystemExit):
        parser().parse_args(["--name", "n", "--ratio", "x"])
    err = capsys.readouterr().err
    assert err == "error: argument --ratio: expected a number, got 'x' (see --help)\n"


def test_overrides_per_cli():
    p = parser(defaults={"ratio": 1.0}, required=["mode"], help={"name": "the name"}, choices={"mode": ("b",)})
    with pytest.raises(SystemExit):
        p.parse_args(["--name", "n"])       # --mode now required
    args = p.parse_args(["--name", "n", "--mode", "b"])
    assert args.ratio == 1.0
    assert "the name" in p.format_help()


def test_same_as_keeps_one_declaration():
    import dataclasses

    from kvcommon.fields import declared, same_as
    from sim.des.serving import ServeConfig
    from sim.layouts import Layout
    serve, layout = declared(ServeConfig), declared(Layout)
    for mine, theirs in (("layout", "name"), ("compact_every", "compact_every"), ("block_size", "block_size")):
        assert serve[mine].default == layout[theirs].default
        assert dict(serve[mine].metadata) == dict(layout[theirs].metadata)
    with pytest.raises(ValueError, match="layout"):
        ServeConfig(hw="h200-sxm", model="llama-2-7b", layout="pages")
    assert dataclasses.is_dataclass(ServeConfig) and same_as(Layout, "block_size").default == 16
