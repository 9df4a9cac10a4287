"""sim.validate's output folder (issue 17): the default writes under results/, never the committed docs/;
docs/ only with --update-docs; an --out that is a file is one error line and exit 2, nothing written."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sim import validate
from tests.sim.test_validate import _ref_rows, write_refs

REPO = Path(__file__).resolve().parents[2]


def run_cli(args, capsys):
    rc = validate.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_out_that_is_a_file_is_one_error_line(tmp_path, capsys):
    target = tmp_path / "report.md"
    target.write_text("mine")
    refs = write_refs(tmp_path / "refs.csv", _ref_rows())
    rc, out, err = run_cli(["--out", target, "--references", refs, "--no-measured"], capsys)
    assert rc == 2 and err.startswith("error: ") and err.count("\n") == 1 and "existing file" in err
    assert target.read_text() == "mine"                      # untouched
    rc, _, err = run_cli(["--out", target / "sub", "--references", refs, "--no-measured"], capsys)
    assert rc == 2 and err.count("\n") == 1 and "is a file" in err


def test_update_docs_and_out_together_is_an_error(tmp_path, capsys):
    rc, _, err = run_cli(["--update-docs", "--out", tmp_path], capsys)
    assert rc == 2 and "--update-docs" in err and err.count("\n") == 1


def test_default_output_goes_to_results_not_docs(tmp_path, monkeypatch, capsys, real_device):
    monkeypatch.chdir(tmp_path)
    refs = write_refs(tmp_path / "refs.csv", _ref_rows())
    docs_before = {p.name: p.stat().st_mtime_ns for p in (REPO / "docs").glob("validation-*")}
    rc, out, err = run_cli(["--references", refs, "--no-measured", "--quiet"], capsys)
    assert rc == 0, err
    made = list((tmp_path / "results").glob("validate-*/validation-report.md"))
    assert len(made) == 1 and str(made[0].parent.relative_to(tmp_path)) in out
    assert (made[0].parent / "validation-parity.png").stat().st_size > 0
    assert {p.name: p.stat().st_mtime_ns for p in (REPO / "docs").glob("validation-*")} == docs_before


def test_update_docs_targets_the_repository_docs():
    assert validate.output_folder(None, True) == REPO / "docs"
    assert validate.output_folder(None, False).parent == Path("results")
    assert validate.output_folder(None, False).name.startswith("validate-")
