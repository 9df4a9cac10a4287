"""traces.capture rejects a prompt + new tokens beyond the model's positions before any run (issue 17):
one error line, exit 2, no run written; a prompt cut with --max-prompt-tokens to fit is accepted."""
from __future__ import annotations

import json

import pytest

from traces.assets import assets_dir
from traces.capture.__main__ import main as capture_main


def _run(argv, capsys):
    try:
        code = capture_main(argv)
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err.strip().splitlines()


def _long_dataset(tmp_path):
    path = tmp_path / "long.jsonl"
    path.write_text(json.dumps({"id": "long0", "text": " ".join(f"word{i} and more" for i in range(3000)),
                                "reference": "the end"}) + "\n")
    return path


def test_prompt_beyond_positions_is_rejected_before_any_run(tmp_path, capsys):
    pytest.importorskip("torch")
    out = tmp_path / "o"
    code, err = _run(["--model", "tiny-llama", "--policy", "full", "--dataset", f"jsonl:{_long_dataset(tmp_path)}",
                      "--n", "1", "--max-new-tokens", "4", "--out", str(out), "--no-progress"], capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith("error: "), err
    assert "sample long0" in err[0] and "exceeds the model's 2048 positions" in err[0]
    assert "--max-prompt-tokens 2044" in err[0]
    assert not (out / "capture.json").exists() and not (out / "shards").exists()


def test_check_positions_counts_the_new_tokens():
    pytest.importorskip("torch")
    from traces.capture.prompts import check_positions
    from traces.models import load_model
    lm = load_model("tiny-llama")
    check_positions(lm, {"a": [1] * 2040, "b": [1] * 10}, 8)          # 2048: fits exactly
    with pytest.raises(ValueError, match=r"sample a: prompt \(2040 tokens\) \+ --max-new-tokens 9"):
        check_positions(lm, {"a": [1] * 2040, "b": [1] * 10}, 9)
    with pytest.raises(ValueError, match="--max-new-tokens must be below 2048"):
        check_positions(lm, {"a": [1] * 3}, 4096)


def test_stories260k_long_text_is_rejected(tmp_path, capsys):
    pytest.importorskip("torch")
    if not (assets_dir() / "stories260K" / "hf").is_dir() or not (assets_dir() / "long_text").is_dir():
        pytest.skip(f"stories260K or long_text assets not under {assets_dir()}")
    code, err = _run(["--model", "stories260k", "--policy", "full", "--dataset", "long-text", "--n", "1",
                      "--max-new-tokens", "8", "--out", str(tmp_path / "o"), "--no-progress"], capsys)
    errors = [line for line in err if line.startswith("error")]   # transformers' own weight-loading bar aside
    assert code == 2 and len(errors) == 1 and "exceeds the model's 512 positions" in errors[0], err
    assert "prompt (1713 tokens)" in errors[0]
