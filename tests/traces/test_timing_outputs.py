"""traces.timing (issue 27 items 5, 6, 8): --out and --hw are checked before any measurement, and a run
writes under results/ unless --update-data asks for the committed grid."""
from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("keyformer.generate")

from tests.helpers import assert_one_line_error  # noqa: E402
from traces import timing  # noqa: E402
from traces.assets import DATA_DIR  # noqa: E402
from traces.timing import cli as timing_cli  # noqa: E402

TINY = ["--model", "tiny-llama", "--batch", "1", "--context", "16", "--policy", "full", "--prefill", "none",
        "--repeats", "1", "--warmup", "0"]


def _run(argv, capsys):
    rc = timing.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("extra, message", [
    (["--hw", "bogus"], "--hw 'bogus': bogus: unknown device name"),
    (["--hw", ""], "--hw must not be empty"),
    (["--out", "FILE"], "is an existing file"),
    (["--out", "FILE/sub"], "is a file, not a folder"),
    (["--update-data", "--out", "x"], "--update-data"),
])
def test_mistakes_are_one_line_and_measure_nothing(extra, message, tmp_path, capsys, monkeypatch):
    (tmp_path / "FILE").write_text("x")
    monkeypatch.chdir(tmp_path)
    measured = []
    monkeypatch.setattr(timing_cli, "measure_grid", lambda *a, **k: measured.append(a) or [])
    rc, out, err = _run(TINY + extra, capsys)
    assert_one_line_error(rc, err, message)
    assert measured == [] and sorted(p.name for p in tmp_path.iterdir()) == ["FILE"]


def test_default_output_is_under_results_and_update_data_is_the_committed_grid(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    roots = []
    monkeypatch.setattr(timing_cli, "measure_grid", lambda models, grid, out, *a, **k: roots.append(out) or [])
    assert _run(TINY, capsys)[0] == 0
    assert _run(TINY + ["--stack", "hf", "--beams", "1"], capsys)[0] == 0
    assert _run(TINY + ["--update-data"], capsys)[0] == 0
    assert roots == [Path("results/timing/cpu"), Path("results/timing/cpu-hf"), DATA_DIR / "cpu"]
