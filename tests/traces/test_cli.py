"""CLI error paths: one `error: ...` line on stderr and exit code 2, never a traceback."""
from __future__ import annotations

import subprocess
import sys

import pytest

from traces.capture.__main__ import main as capture_main
from traces.quality import main as quality_main


def _run(main, argv, capsys):
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse errors
        code = exc.code
    err = capsys.readouterr().err.strip().splitlines()
    return code, err


BASE = ["--model", "tiny-llama", "--dataset", "xsum", "--out", "OUT"]


@pytest.mark.parametrize("argv, message", [
    (["--policy", "full", "--dataset", "xsum", "--out", "x"], "required: --model"),
    (BASE + ["--policy", "nonsense"], "unknown policy 'nonsense'"),
    (BASE + ["--policy", "h2o", "--cache-ratios", "0.5,1.5"], "--cache-ratios must be in (0, 1], got 1.5"),
    (BASE + ["--policy", "h2o", "--cache-ratios", "half"], "expected comma-separated numbers, got 'half'"),
    (BASE[:2] + ["--dataset", "wikipedia", "--out", "x", "--policy", "h2o"], "unknown dataset 'wikipedia'"),
    (BASE + ["--policy", "h2o", "--n", "0"], "--n must be >= 1"),
    (BASE + ["--policy", "h2o", "--recent-ratio", "2"], "--recent-ratio must be in [0, 1]"),
    (BASE + ["--policy", "keyformer:noise"], "bad policy parameter 'noise'"),
    (BASE + ["--policy", "keyformer:noise=pink"], "noise must be one of"),
    (BASE + ["--policy", "h2o:bogus=1"], "has no parameter bogus"),
    (BASE + ["--policy", "h2o", "--device", "tpu"], "--device must be cpu or cuda"),
])
def test_capture_usage_errors(argv, message, capsys, tmp_path):
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in argv]
    code, err = _run(capture_main, argv, capsys)
    assert code == 2
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err


def test_capture_missing_model_folder_and_dataset_file(capsys, tmp_path):
    pytest.importorskip("torch")
    code, err = _run(capture_main, ["--model", str(tmp_path / "no-model"), "--policy", "full", "--dataset",
                                    f"jsonl:{tmp_path / 'none.jsonl'}", "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and len(err) == 1 and "none.jsonl not found" in err[0]
    (tmp_path / "d.jsonl").write_text('{"text": "hello there"}\n')
    code, err = _run(capture_main, ["--model", str(tmp_path / "no-model"), "--policy", "full", "--dataset",
                                    f"jsonl:{tmp_path / 'd.jsonl'}", "--n", "1", "--out", str(tmp_path / "o")],
                     capsys)
    assert code == 2 and len(err) == 1 and "model folder" in err[0] and "not found" in err[0]


def test_capture_prompt_budget_too_small(capsys, tmp_path):
    pytest.importorskip("torch")
    (tmp_path / "d.jsonl").write_text('{"text": "hello there", "instruction": "Summarize this text please."}\n')
    code, err = _run(capture_main, ["--model", "tiny-llama", "--policy", "full", "--dataset",
                                    f"jsonl:{tmp_path / 'd.jsonl'}", "--max-prompt-tokens", "4", "--n", "1",
                                    "--out", str(tmp_path / "o"), "--no-progress"], capsys)
    assert code == 2 and len(err) == 1 and "leaves no room" in err[0]


def test_quality_on_a_missing_or_broken_folder(capsys, tmp_path):
    code, err = _run(quality_main, [str(tmp_path / "nothing")], capsys)
    assert code == 2 and err == [f"error: {tmp_path / 'nothing'}: no such trace folder"]
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "manifest.json").write_text("{")
    code, err = _run(quality_main, [str(tmp_path / "bad")], capsys)
    assert code == 2 and len(err) == 1 and "manifest.json: not valid JSON" in err[0]


def test_capture_cli_in_a_subprocess_prints_one_line():
    proc = subprocess.run([sys.executable, "-m", "traces.capture", "--model", "tiny-llama", "--policy", "full",
                           "--dataset", "nope", "--out", "/tmp/unused"], capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["error: unknown dataset 'nope' (choose from xsum, cnndm, soda, "
                                                "dialogsum, long-text, tinystories, long-text:NAME, jsonl:PATH)"]
