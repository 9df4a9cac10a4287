"""kvcommon.cli's output-folder check, staged folders and integer bounds (issue 27 items 5, 7, 9)."""
import argparse

import pytest

from kvcommon.cli import INT_LIMIT, check_out_folder, checked_int, csv_list, non_negative_int, positive_int, staged_folder
from kvcommon.fields import _typed, _typed_list


def test_check_out_folder_refuses_empty_file_and_path_under_a_file(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="--out: empty folder name"):
        check_out_folder("--out", "")
    with pytest.raises(ValueError, match="is an existing file"):
        check_out_folder("--out", tmp_path / "file")
    with pytest.raises(ValueError, match="is a file, not a folder"):
        check_out_folder("--out", tmp_path / "file" / "sub" / "deeper")
    assert check_out_folder("--out", tmp_path / "new" / "folder") == tmp_path / "new" / "folder"
    assert not (tmp_path / "new").exists()      # checking creates nothing


def test_staged_folder_moves_outputs_in_at_the_end_only(tmp_path):
    out = tmp_path / "res"
    with pytest.raises(KeyboardInterrupt):
        with staged_folder(out) as stage:
            (stage / "a.png").write_text("half")
            raise KeyboardInterrupt
    assert not out.exists() and list(tmp_path.iterdir()) == []    # no partial folder, no staging left
    with staged_folder(out) as stage:
        (stage / "table.csv").write_text("new")
        (stage / "sub").mkdir()
        (stage / "sub" / "x.md").write_text("x")
    assert (out / "table.csv").read_text() == "new" and (out / "sub" / "x.md").exists()
    (out / "points.csv").write_text("stale")
    (out / "mine.txt").write_text("the user's")
    with staged_folder(out, owned=("points.csv",)) as stage:
        (stage / "table.csv").write_text("newer")
    assert (out / "table.csv").read_text() == "newer"
    assert not (out / "points.csv").exists() and (out / "mine.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["res"]


def test_integers_beyond_2_53_are_refused_with_their_flag():
    assert checked_int(str(INT_LIMIT)) == INT_LIMIT
    huge = "99999999999999999999999"
    with pytest.raises(ValueError, match="2\\^53"):
        checked_int(huge)
    for parse in (positive_int, non_negative_int, _typed(checked_int, "--prompt"), _typed_list(checked_int),
                  csv_list(int, "--prompts")):
        with pytest.raises(argparse.ArgumentTypeError, match="2\\^53"):
            parse(huge)
    assert non_negative_int("0") == 0
    with pytest.raises(argparse.ArgumentTypeError, match="from 0 to 2\\^53, got '-1'"):
        non_negative_int("-1")
