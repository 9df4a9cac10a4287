"""traces.timing: the timing mode runs in seconds on a tiny model, writes a folder sim.validate can load,
resumes without re-measuring, refuses to mix settings, and gives one-line errors."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("torch")
pytest.importorskip("keyformer.generate")

from tests.helpers import assert_one_line_error  # noqa: E402
from traces import timing  # noqa: E402

TINY = ["--model", "tiny-llama", "--batch", "1,2", "--context", "32,64", "--policy", "full",
        "--policy", "keyformer:0.5", "--prefill", "16", "--repeats", "2", "--warmup", "1"]


def run(argv, capsys):
    rc = timing.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_tiny_model_writes_a_loadable_folder(tmp_path, capsys):
    rc, _, err = run(TINY + ["--out", tmp_path], capsys)
    assert rc == 0, err
    folder = tmp_path / "tiny-llama"
    table = pd.read_parquet(folder / "timing.parquet")
    assert len(table) == 2 * 2 * 2 + 1
    assert list(table.columns) == list(timing.TIMING_COLUMNS)
    assert (table["median_s"] > 0).all() and (table["p10_s"] <= table["p90_s"]).all()
    assert set(table["omp_wait_policy"]) == {"ACTIVE"} and set(table["threads"]) == {1}
    decode = table[table["phase"] == "decode"].set_index(["policy", "batch", "context"])
    # kept tokens come from the policy itself: keyformer holds its budget, full the whole context (+ steps)
    assert decode.loc[("keyformer", 1, 64), "kv_tokens"] == 32
    assert decode.loc[("full", 1, 64), "kv_tokens"] > 64
    assert decode.loc[("keyformer", 1, 64), "slots"] == 33
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["kind"] == "kvsim-timing"
    # one thread: predicted on the one-thread calibration when it is there (a path relative to the folder)
    assert manifest["hw_device"] == timing.default_hw(1) or manifest["hw_device"].endswith("cpu-local-1t.yaml")
    assert manifest["env"]["omp_wait_policy"] == "ACTIVE" and manifest["points"] == len(table)
    # the simulator side reads it without torch
    from sim.validation.measured import load_timing
    from sim.models import load_model
    source = load_timing(folder)
    assert source.profile == "kvsim-eager" and load_model(source.model_config).n_layers == 2
    assert source.hw == "cpu-local" or Path(source.hw).is_file()
    assert (folder / "timing.csv").exists() and not list(folder.glob("*.tmp"))


def test_rerun_resumes_and_refuses_other_settings(tmp_path, capsys):
    small = ["--model", "tiny-gpt2", "--batch", "1", "--context", "32", "--policy", "full", "--prefill", "none",
             "--repeats", "2", "--warmup", "0", "--out", tmp_path]
    assert run(small, capsys)[0] == 0
    first = pd.read_parquet(tmp_path / "tiny-gpt2" / "timing.parquet")
    # a grid with one more context measures only the new point; the old row is kept as it was
    rc, _, err = run(small[:5] + ["32,48"] + small[6:], capsys)
    assert rc == 0, err
    second = pd.read_parquet(tmp_path / "tiny-gpt2" / "timing.parquet")
    assert len(second) == 2
    old = second[second["context"] == 32].iloc[0]
    assert old["measured_at"] == first.iloc[0]["measured_at"] and old["median_s"] == first.iloc[0]["median_s"]
    # other repeats would mix incomparable points: refused with one line
    rc, _, err = run(small[:-2] + ["--repeats", "3", "--out", tmp_path], capsys)
    assert rc == 2 and "other settings" in err and "repeats" in err and err.count("\n") == 1
    # --fresh starts over
    rc, _, _ = run(small[:-2] + ["--repeats", "3", "--fresh", "--out", tmp_path], capsys)
    assert rc == 0 and len(pd.read_parquet(tmp_path / "tiny-gpt2" / "timing.parquet")) == 1


@pytest.mark.parametrize("argv, message", [
    (["--policy", "keyformer"], "needs a ratio"),
    (["--policy", "keyformer:1.5"], "ratio must be in (0, 1]"),
    (["--policy", "full:0.5"], "full keeps the whole context"),
    (["--model", "no-such-model"], "not found"),
    (["--batch", "0"], "--batch must be >= 1, got 0"),
    (["--context", "a,b"], "expected comma-separated integers, got 'a,b'"),
    (["--threads", "0"], "--threads must be >= 1, got 0"),
    (["--dtype", "int4"], "argument --dtype: invalid choice: 'int4'"),
    (["--policy", "keyformer:noise=x"], "varies the cache ratio only"),
    (["--prefill", "1"], "--prefill must be >= 2, got 1"),
    (["--device", "cuda"], "--device other than cpu needs --out"),
    (["--context", "8192"], "has 4096 positions"),
    (["--beams", "4"], "--beams needs stack hf"),
    (["--stack", "hf", "--policy", "keyformer:0.5"], "--policy must be full only with stack hf"),
    (["--stack", "hf", "--prefill", "16"], "--prefill must be none with stack hf"),
    (["--attn", "sdpa"], "--attn needs stack hf"),
    (["--stack", "hf", "--beams", "0"], "--beams must be >= 1"),
    (["--stack", "vllm"], "invalid choice"),
])
def test_cli_errors_are_one_line(tmp_path, capsys, argv, message):
    rc, _, err = run(["--model", "tiny-gpt2", "--out", tmp_path] + argv, capsys)
    assert_one_line_error(rc, err, message)


def test_module_runs_on_its_own(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "traces.timing", "--model", "nope", "--out", str(tmp_path)],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr


HF = ["--stack", "hf", "--model", "tiny-gpt2", "--context", "16,32", "--repeats", "2", "--warmup", "1"]


def test_hf_stack_times_generate_steps_and_validates_under_hf_eager(tmp_path, capsys):
    """--stack hf: steps of transformers' own beam search, in a folder sim.validate predicts with hf-eager
    at the recorded beam width (rows = batch x beams), with per-round medians for the noise figures."""
    rc, _, err = run(HF + ["--rounds", "2", "--out", tmp_path], capsys)
    assert rc == 0, err
    folder = tmp_path / "tiny-gpt2"
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["software"] == "hf-eager" and manifest["stack"] == "hf" and manifest["beams"] == 4
    assert manifest["grid_settings"]["stack"] == "hf" and "beam-search step" in manifest["what"]
    table = pd.read_parquet(folder / "timing.parquet").set_index("context")
    assert set(table["phase"]) == {"decode"} and set(table["policy"]) == {"full"} and set(table["batch"]) == {1}
    # steps 2..3 of generate (one warm-up interval dropped) attend context + 2 and + 3 keys: mean + 2.5
    assert table.loc[32, "slots"] == round(32 + 1 + 1.5) and table.loc[32, "kv_tokens"] == pytest.approx(32 + 1.5)
    assert (table["rounds"] == 2).all() and table["round_medians_s"].str.split().str.len().eq(2).all()
    assert (table["median_s"] > 0).all()
    from sim.validation.measured import load_timing
    from sim.validation.points import measured_points
    source = load_timing(folder)
    assert source.profile == "hf-eager" and source.beams == 4
    points, compare = measured_points(source)
    assert (points["profile"] == "hf-eager").all() and points["configuration"].str.contains("b1x4beam").all()
    assert points["scatter_pct"].notna().all()
    # the comparison profiles see the same beams: the eager HF stack moves more bytes than the fused ideal
    by = compare.pivot_table(index="id", columns="profile", values="predicted")
    assert (by["hf-eager"] > by["fused"]).all()


def test_hf_folder_refuses_to_resume_as_the_kvsim_stack(tmp_path, capsys):
    assert run(HF + ["--out", tmp_path], capsys)[0] == 0
    rc, _, err = run(["--model", "tiny-gpt2", "--context", "16,32", "--policy", "full", "--prefill", "none",
                      "--repeats", "2", "--warmup", "1", "--out", tmp_path], capsys)
    assert_one_line_error(rc, err, "other settings")
