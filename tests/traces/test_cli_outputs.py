"""traces CLIs keep the error contract on --out mistakes and write nothing half-done or tracked (issue 27)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import assert_one_line_error
from traces.assets import DATA_DIR, have_assets
from traces.capture.__main__ import main as capture_main
from traces.quality import main as quality_main, report_folder

REPO = Path(__file__).resolve().parents[2]
CAPTURE = ["--model", "tiny-llama", "--policy", "full", "--dataset", "xsum", "--n", "1", "--max-new-tokens", "2",
           "--no-progress"]


def _run(main, argv, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("main, argv", [(capture_main, CAPTURE), (quality_main, ["TRACE"])])
def test_out_that_is_a_file_or_under_one_is_one_line(main, argv, tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    trace = next(iter(sorted(DATA_DIR.glob("*/*/manifest.json"))), None)
    argv = [str(trace.parent) if a == "TRACE" and trace else a for a in argv]
    for out, fragment in ((tmp_path / "file", "is an existing file"), (tmp_path / "file" / "x", "is a file, not a folder")):
        code, _, err = _run(main, argv + ["--out", str(out)], capsys)
        assert_one_line_error(code, err, fragment)


def test_capture_creates_no_out_before_the_model_and_device_are_checked(tmp_path, capsys):
    pytest.importorskip("torch")
    out = tmp_path / "o"
    code, _, err = _run(capture_main, ["--model", str(tmp_path / "no-model")] + CAPTURE[2:] + ["--out", str(out)], capsys)
    assert_one_line_error(code, err, "not found")
    assert not out.exists()


@pytest.mark.skipif(not have_assets("news_summarization", "xsum_1000_h2o.jsonl"),
                    reason="the XSum asset is absent (../shared/assets or KVSIM_ASSETS): capture checks it first")
def test_capture_creates_no_out_before_the_device_is_checked(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: nothing to refuse")
    out = tmp_path / "o"
    code, _, err = _run(capture_main, CAPTURE + ["--device", "cuda", "--out", str(out)], capsys)
    assert_one_line_error(code, err, "no CUDA device")
    assert not out.exists()


def test_seed_below_zero_names_the_flag(tmp_path, capsys):
    code, _, err = _run(capture_main, CAPTURE + ["--seed", "-1", "--out", str(tmp_path / "o")], capsys)
    assert_one_line_error(code, err, "--seed must be >= 0")


def test_quality_leaves_bundled_traces_alone_without_the_flag(tmp_path, monkeypatch):
    trace = DATA_DIR / "smollm2-135m" / "xsum"
    assert report_folder(trace) == Path("results") / "quality" / "smollm2-135m" / "xsum"
    assert report_folder(trace, refresh_bundled=True) == trace / "quality"
    assert report_folder(tmp_path / "mine") == tmp_path / "mine" / "quality"


def test_quality_writes_a_bundled_trace_report_under_results(tiny_trace_dir, tmp_path, monkeypatch, capsys):
    pytest.importorskip("rouge_score")
    import shutil
    import warnings
    import traces.assets
    data = tmp_path / "data"
    bundled = data / "tiny" / "trace"
    shutil.copytree(tiny_trace_dir, bundled, ignore=shutil.ignore_patterns("quality"))
    monkeypatch.setattr(traces.assets, "DATA_DIR", data)
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, out, err = _run(quality_main, [str(bundled)], capsys)
    assert code == 0, err
    assert out.strip() == str(Path("results") / "quality" / "tiny" / "trace" / "quality.md")
    assert (tmp_path / out.strip()).is_file() and not (bundled / "quality").exists()
    assert not [w for w in caught if w.filename.endswith("quality.py")]    # pandas' join deprecation
    code, out, err = _run(quality_main, [str(bundled), "--refresh-bundled"], capsys)
    assert code == 0 and (bundled / "quality" / "quality.md").is_file()


@pytest.mark.slow
def test_quality_on_a_bundled_trace_writes_under_results_with_no_warning(tmp_path):
    pytest.importorskip("rouge_score")
    trace = DATA_DIR / "stories260k" / "tinystories"
    if not (trace / "manifest.json").is_file():
        pytest.skip("bundled stories260k trace absent")
    before = {p.name: p.stat().st_mtime_ns for p in (trace / "quality").iterdir()}
    proc = subprocess.run([sys.executable, "-m", "traces.quality", str(trace)], cwd=tmp_path, capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""     # no pandas deprecation warning, no bar
    assert (tmp_path / "results" / "quality" / "stories260k" / "tinystories" / "quality.md").is_file()
    assert {p.name: p.stat().st_mtime_ns for p in (trace / "quality").iterdir()} == before
