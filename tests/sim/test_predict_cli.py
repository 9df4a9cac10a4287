"""`python -m sim.predict`: output, JSON keys, --trace seam, and one-line errors with exit code 2."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sim.cli import run
from sim.predict import main
from tests.helpers import assert_one_line_error
from tests.sim.conftest import real_device_names

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif("a100-80g-sxm" not in real_device_names(), reason="hwmodels devices not shipped yet")
BASE = ["--hw", "a100-80g-sxm", "--model", "mpt-7b", "--batch", "1", "--prompt", "4096", "--gen", "4096"]


def cli(argv, capsys):
    code = run(main, argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_human_summary(capsys):
    code, out, err = cli(BASE + ["--policy", "keyformer", "--cache-ratio", "0.5", "--beams", "4"], capsys)
    assert code == 0 and err == ""
    for label in ("TTFT", "TPOT (mean)", "end-to-end", "tokens/s", "peak memory", "max batch", "KV per token"):
        assert label in out
    assert "512 KiB" in out and "beams 4" in out


def test_a_mixture_of_experts_says_what_a_decode_step_reads(capsys):
    argv = ["--hw", "h100-sxm", "--model", "mistralai/Mixtral-8x7B-v0.1", "--prompt", "128", "--gen", "16",
            "--weight-dtype", "fp8", "--kv-dtype", "fp8"]
    code, out, _ = cli(argv, capsys)
    assert code == 0 and "2.0 of 8 per layer read by a decode step of 1 row:" in out
    code, out, _ = cli(argv + ["--batch", "64"], capsys)
    assert "8.0 of 8 per layer" in out
    code, out, _ = cli(BASE, capsys)
    assert "experts" not in out          # dense models: no such line


def test_breakdown_prints_the_operator_tables(capsys):
    code, out, _ = cli(BASE + ["--policy", "h2o", "--cache-ratio", "0.9", "--breakdown"], capsys)
    assert code == 0
    assert "prefill" in out and "decode step, mean" in out
    for op in ("qkv_proj", "attn_scores", "softmax", "attn_v", "out_proj", "mlp", "lm_head", "kv_write",
               "score_update", "select_evict", "select_topk", "compact"):
        assert op in out


def test_json_has_contract_keys_and_echoes_inputs(capsys):
    code, out, _ = cli(BASE + ["--policy", "window", "--cache-ratio", "0.25", "--kv-dtype", "fp8", "--json"], capsys)
    assert code == 0
    d = json.loads(out)
    for key in ("ttft_s", "tpot_s", "e2e_s", "tokens_per_s", "peak_memory_bytes", "max_batch",
                "max_batch_tokens_per_s", "decode_bound", "kv_bytes_per_token"):
        assert key in d
    assert d["policy"] == "window" and d["cache_ratio"] == 0.25 and d["kv_dtype"] == "fp8"
    assert d["kv_bytes_per_token"] == 256 * 1024           # MPT-7B at one byte per element
    assert d["e2e_s"] == pytest.approx(d["ttft_s"] + 4095 * d["tpot_s"])


def test_json_breakdown_is_valid_json(capsys):
    code, out, _ = cli(BASE + ["--json", "--breakdown"], capsys)
    d = json.loads(out)                                    # no Infinity/NaN tokens
    assert {"prefill_ops", "decode_ops"} <= set(d) and d["decode_ops"][0]["step"] == "first"


def test_model_config_file_and_device_file(capsys, tmp_path):
    from hwmodels import DEVICES_DIR
    cfg = REPO / "sim" / "models" / "llama-3-8b.json"
    code, out, _ = cli(["--hw", str(DEVICES_DIR / "h100-sxm.yaml"), "--model", str(cfg), "--prompt", "100",
                        "--gen", "10", "--json"], capsys)
    assert code == 0 and json.loads(out)["kv_bytes_per_token"] == 128 * 1024


def test_trace_feeds_kv_override(capsys, monkeypatch):
    import traces
    calls = {}

    class FakeTrace:
        def kv_override(self, **kw):
            calls.update(kw)
            return np.full((kw["gen"] + 1, kw["n_layers"]), 0.25 * kw["prompt"])

    monkeypatch.setattr(traces, "load", lambda path: FakeTrace())
    code, out, _ = cli(BASE + ["--policy", "keyformer", "--cache-ratio", "0.25", "--trace", "somewhere", "--json"], capsys)
    assert code == 0
    assert calls == dict(policy="keyformer", cache_ratio=0.25, prompt=4096, gen=4096, n_layers=32, heads="mean")
    traced = json.loads(out)
    code, out, _ = cli(BASE + ["--policy", "keyformer", "--cache-ratio", "0.25", "--json"], capsys)
    formula = json.loads(out)
    assert traced["kv_source"] == "trace" and formula["kv_source"] == "formula"
    assert traced["tpot_s"] == pytest.approx(formula["tpot_s"], rel=1e-9)   # the same lengths either way


def test_trace_failures_are_one_line(capsys, monkeypatch, tmp_path):
    code, _, err = cli(BASE + ["--trace", str(tmp_path / "missing")], capsys)
    assert code == 2 and err.startswith("error: trace ") and err.count("\n") == 1


@pytest.mark.parametrize("extra, fragment", [
    (["--hw", "no-such-gpu"], "no-such-gpu"),
    (["--model", "llama-9"], "unknown model"),
    (["--model", "/no/such/config.json"], "not found"),
    (["--hw", "/no/such/device.yaml"], "device.yaml"),
    (["--kv-dtype", "fp7"], "'fp7'"),
    (["--weight-dtype", "float64"], "'float64'"),
    (["--cache-ratio", "0"], "--cache-ratio"),
    (["--cache-ratio", "1.5"], "--cache-ratio"),
    (["--recent-ratio", "2"], "--recent-ratio"),
    (["--policy", "sparse"], "unknown policy 'sparse'; expected one of full, window"),
    (["--batch", "0"], "--batch must be >= 1, got 0"),
    (["--gen", "many"], "expected an integer"),
    (["--profile", "nope"], "unknown profile"),
    (["--cache-ratio", "half"], "expected a number"),
])
def test_user_errors_are_one_line_exit_2(capsys, extra, fragment):
    code, out, err = cli(BASE + extra, capsys)
    assert_one_line_error(code, err, fragment, out=out)


def test_missing_required_flag(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--hw", "a100-80g-sxm"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1


def test_module_entry_point_end_to_end():
    ok = subprocess.run([sys.executable, "-m", "sim.predict", *BASE, "--json"], cwd=REPO, capture_output=True, text=True)
    assert ok.returncode == 0 and json.loads(ok.stdout)["max_batch"] >= 1
    bad = subprocess.run([sys.executable, "-m", "sim.predict", *BASE, "--kv-dtype", "fp7"], cwd=REPO,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stdout == "" and bad.stderr.count("\n") == 1


def test_trace_heads_selects_a_ragged_or_padded_attention_kernel(capsys):
    """adakv's heads hold different lengths: a kernel padded to the fullest head reads more than the mean."""
    import json
    from sim import predict as cli
    trace = str(Path(__file__).resolve().parents[2] / "traces/data/stories260k/tinystories-adaptive")
    out = {}
    for heads in ("mean", "max"):
        assert cli.main(["--hw", "h200-sxm", "--model", "llama-2-7b", "--batch", "8", "--prompt", "1024", "--gen",
                         "64", "--policy", "adakv", "--cache-ratio", "0.5", "--trace", trace, "--trace-heads", heads,
                         "--json"]) == 0
        out[heads] = json.loads(capsys.readouterr().out)
    assert out["max"]["tpot_s"] > out["mean"]["tpot_s"] and out["max"]["max_batch"] < out["mean"]["max_batch"]
