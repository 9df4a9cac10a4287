"""sim.serve on the real analytic engine: agreement with sim.engine.predict, capacity, Keyformer's gain, CLI."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from hwmodels import load_device
from sim import engine
from sim.des.analytic import TraceKV
from sim.serve import main, simulate, simulate_row
from tests.helpers import assert_one_line_error

MPT = dict(hw="a100-80g-sxm", model="mpt-7b", kv_dtype="fp16", weight_dtype="fp16")


@pytest.mark.parametrize("hw,model,policy,ratio,prompt,gen", [
    ("a100-80g-sxm", "mpt-7b", "full", 1.0, 4096, 512),
    ("a100-80g-sxm", "mpt-7b", "keyformer", 0.5, 4096, 512),
    ("h100-sxm", "llama-3-8b", "h2o", 0.2, 1024, 256),
    ("h100-sxm", "llama-3-8b", "streaming", 0.3, 2000, 64),
    ("l4", "gpt2", "window", 0.5, 100, 50),
])
def test_one_request_without_load_matches_the_analytic_model(hw, model, policy, ratio, prompt, gen):
    res = simulate(hw, model, policy, ratio, qps=1.0, requests=1, prompt=prompt, gen=gen)
    pred = engine.predict(hw, model, 1, prompt, gen, policy, ratio)
    assert res.ttft_s["mean"] == pytest.approx(pred.ttft_s, rel=0.01)
    assert res.tpot_s["mean"] == pytest.approx(pred.tpot_s, rel=0.01)
    assert res.e2e_s["mean"] == pytest.approx(pred.e2e_s, rel=0.01)
    assert res.queue_s["mean"] == 0.0


def test_low_qps_stream_sees_batch_one_latencies():
    # requests 1000 s apart never overlap: every one sees the unloaded latency
    res = simulate("h100-sxm", "llama-3-8b", "keyformer", 0.5, qps=0.001, requests=5, prompt=512, gen=64, seed=1)
    pred = engine.predict("h100-sxm", "llama-3-8b", 1, 512, 64, "keyformer", 0.5)
    assert res.max_in_flight == 1
    assert res.ttft_s["p99"] == pytest.approx(pred.ttft_s, rel=0.01)
    assert res.tpot_s["p99"] == pytest.approx(pred.tpot_s, rel=0.01)


@pytest.mark.parametrize("policy,ratio", [("full", 1.0), ("keyformer", 0.5)])
def test_throughput_saturates_at_the_analytic_max_batch_capacity(policy, ratio):
    pred = engine.predict(MPT["hw"], MPT["model"], 1, 4096, 1024, policy, ratio,
                          kv_dtype="fp16", weight_dtype="fp16")
    n = 4 * pred.max_batch_all_at_once
    # reserve admission holds each request's peak, the quantity max_batch_all_at_once is computed from
    burst = simulate(policy=policy, cache_ratio=ratio, qps=math.inf, requests=n, prompt=4096, gen=1024,
                     admission="reserve", **MPT)
    assert burst.max_in_flight in (pred.max_batch_all_at_once, pred.max_batch_all_at_once + 1)  # DES workspace is one step, not a batch
    assert burst.tokens_per_s == pytest.approx(pred.max_batch_all_at_once_tokens_per_s, rel=0.03)
    # Poisson at twice the capacity: the server saturates near the same throughput
    capacity_qps = pred.max_batch_all_at_once_tokens_per_s / 1024
    loaded = simulate(policy=policy, cache_ratio=ratio, qps=2 * capacity_qps, requests=n, prompt=4096, gen=1024,
                      admission="reserve", seed=3, **MPT)
    assert loaded.tokens_per_s == pytest.approx(pred.max_batch_all_at_once_tokens_per_s, rel=0.06)
    assert loaded.busy_fraction > 0.97


def test_keyformer_half_cache_doubles_the_batch_and_raises_throughput_mpt_4096_4096():
    # ~9 s: the headline check, kept in the default run
    common = dict(qps=math.inf, requests=60, prompt=4096, gen=4096, **MPT)
    full = simulate(policy="full", admission="reserve", **common)
    kf = simulate(policy="keyformer", cache_ratio=0.5, admission="reserve", **common)
    # peak per request: full n + gen - 1 = 8191 tokens, Keyformer max(n, k + 1) = 4096 tokens
    assert 1.8 <= kf.max_in_flight / full.max_in_flight <= 2.2
    assert kf.tokens_per_s / full.tokens_per_s > 2.0
    # on-demand blocks (vLLM): Keyformer drops to k + 1 tokens after prefill and fits even more, while
    # full attention overcommits and pays recompute preemptions; the gain holds there too
    kf_paged = simulate(policy="keyformer", cache_ratio=0.5, admission="paged", **common)
    full_paged = simulate(policy="full", admission="paged", **common)
    assert kf_paged.mean_in_flight > kf.mean_in_flight
    assert kf_paged.mean_in_flight > 2 * full_paged.mean_in_flight
    assert kf_paged.tokens_per_s > 2 * full_paged.tokens_per_s
    assert full_paged.preemptions > 0 and kf_paged.preemptions == 0


def test_keyformer_half_cache_doubles_the_batch_mpt_2048_2048():
    # the fast version of the check above; the doubling needs gen ~ prompt (the prefill still holds n)
    common = dict(qps=math.inf, requests=150, prompt=2048, gen=2048, admission="reserve", **MPT)
    full = simulate(policy="full", **common)
    kf = simulate(policy="keyformer", cache_ratio=0.5, **common)
    assert 1.8 <= kf.max_in_flight / full.max_in_flight <= 2.2
    assert kf.tokens_per_s > 1.8 * full.tokens_per_s


def test_memory_never_exceeds_device_and_everything_completes_under_overload():
    res = simulate(policy="full", qps=5.0, requests=120, prompt=2048, gen=1024, seed=2, **MPT)
    assert res.completed == 120 and res.dropped == 0
    assert res.preemptions > 0  # on-demand allocation overcommits, then recomputes
    assert res.peak_kv_bytes <= res.kv_capacity_bytes
    assert res.peak_memory_bytes <= load_device("a100-80g-sxm").memory_bytes      # 80 GiB
    assert (res.timeline.kv_bytes <= res.kv_capacity_bytes).all()


def test_request_too_long_for_the_device_is_dropped():
    res = simulate(policy="full", qps=math.inf, requests=3, prompt=100_000, gen=100_000, **MPT)
    assert res.completed == 0 and res.dropped == 3
    assert res.tokens_per_s == 0.0 or math.isnan(res.tokens_per_s)


def test_same_seed_is_deterministic():
    kw = dict(policy="h2o", cache_ratio=0.3, qps=8.0, requests=80, prompt=1024, gen=256, arrivals="gamma", cv=2.0,
              **MPT)
    a, b = simulate(seed=5, **kw), simulate(seed=5, **kw)
    assert a.to_row() == {**b.to_row(), "wall_s": a.wall_s}
    assert simulate(seed=6, **kw).to_row()["ttft_s_p99"] != a.to_row()["ttft_s_p99"]


class FakeTrace:
    """Duck-typed traces.Trace: two samples, one keeping half the tokens of the other."""

    def kv_override_per_sample(self, policy, cache_ratio, prompt, gen, n_layers, heads="mean"):
        rows = np.arange(gen + 1, dtype=float)[:, None]
        base = np.minimum(prompt + rows, cache_ratio * prompt) * np.ones((1, n_layers))
        return np.stack([base, base / 2]), ["a", "b"]


def test_trace_kv_gives_each_request_its_sample():
    kv = TraceKV(FakeTrace(), "h2o", 0.5, n_layers=4)
    first, second, third = (kv.decode_kv(i, 1000, 10) for i in range(3))
    assert first[0] == 500 and second[0] == 250 and third is first
    assert kv.n_samples == 2


def write_tiny_trace(folder, prompt_len=100, steps=10, layers=2, heads=2):
    """A minimal trace folder in the traces.schema format: H2O at 0.5, two samples, the second one
    holding half the budget of the first (heterogeneous budgets across requests)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from traces import schema

    rows = []
    for sample, kept in (("a", 50), ("b", 25)):
        for step in range(-1, steps):
            generated_kept = min(step + 1, 10)
            for layer in range(layers):
                for head in range(heads):
                    rows.append(dict(sample=sample, policy="h2o", cache_ratio=0.5, step=step, layer=layer,
                                     head=head, prompt_len=prompt_len, kv_len=kept,
                                     kept_prompt=kept - generated_kept, mass_retained=0.9))
    folder.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema.KV_SCHEMA), folder / schema.KV)
    for name, sch in ((schema.STEPS, schema.STEPS_SCHEMA), (schema.KEPT, schema.KEPT_SCHEMA)):
        pq.write_table(sch.empty_table(), folder / name)
    (folder / schema.TEXTS).write_text("")
    (folder / schema.MANIFEST).write_text(json.dumps({"schema_version": schema.SCHEMA_VERSION,
                                                       "kind": schema.KIND}))
    return folder


def test_trace_folder_drives_per_request_kv(tmp_path, capsys):
    pytest.importorskip("traces")
    folder = write_tiny_trace(tmp_path / "trace")
    kw = dict(policy="h2o", cache_ratio=0.5, qps=math.inf, requests=40, prompt=2048, gen=256, **MPT)
    traced = simulate(trace=str(folder), **kw)
    formula = simulate(**kw)
    assert traced.config["kv_source"] == "trace" and traced.config["trace_samples"] == 2
    # the trace's first sample keeps the formula's budget k = 1024, the second half of it: less memory and
    # less KV read per step than the formula, which gives every request k
    assert traced.completed == 40
    assert traced.mean_kv_bytes == pytest.approx(0.75 * formula.mean_kv_bytes, rel=0.05)
    assert traced.tpot_s["mean"] < formula.tpot_s["mean"]
    # a loaded Trace object works as well as its folder (a sweep loads it once)
    import traces
    loaded = simulate(trace=traces.load(folder), **kw)
    assert loaded.to_row()["tpot_s_mean"] == traced.to_row()["tpot_s_mean"]
    assert loaded.config["trace"] == str(folder)
    # the CLI takes the same folder; a ratio the trace lacks is a one-line error
    assert main(BASE + ["--policy", "h2o", "--cache-ratio", "0.5", "--requests", "5", "--prompt", "512",
                        "--gen", "16", "--trace", str(folder), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["kv_source"] == "trace"
    assert main(BASE + ["--policy", "h2o", "--cache-ratio", "0.3", "--prompt", "512", "--gen", "16",
                        "--trace", str(folder)]) == 2
    assert "cache ratio 0.3 not captured" in capsys.readouterr().err


def test_bundled_trace_drives_the_des_when_present():
    traces = pytest.importorskip("traces")
    folders = traces.bundled()
    if not folders:
        pytest.skip("no bundled trace folders yet (traces/data/*/manifest.json)")
    trace = traces.load(traces.bundled(folders[0]))
    policy = next((p for p in trace.policies if p != "full"), trace.policies[0])
    ratio = trace.cache_ratios(policy)[0]
    res = simulate("h100-sxm", "llama-3-8b", policy, ratio, qps=20.0, requests=20, prompt=1024, gen=64,
                   trace=str(traces.bundled(folders[0])))
    assert res.completed == 20 and res.config["kv_source"] == "trace"


def test_simulate_row_for_the_sweep():
    row = simulate_row({"hw": "h100-sxm", "model": "llama-3-8b", "policy": "keyformer", "cache_ratio": 0.5,
                        "prompt": 512.0, "gen": 32.0, "qps": 50.0, "requests": 30.0, "batch": 8.0,
                        "profile": "fused", "notes": "ignored"})
    assert row["completed"] == 30 and row["max_batch_seen"] <= 8
    assert {"ttft_s_p99", "tpot_s_mean", "tokens_per_s", "requests_per_s", "peak_memory_bytes"} <= set(row)


def test_simulate_accepts_loaded_device_and_model_objects(capsys, monkeypatch):
    monkeypatch.setenv("KVSIM_PROGRESS", "1")     # bars only on a terminal unless forced (capsys is none)
    from hwmodels import load_device
    from sim.models import load_model
    res = simulate(load_device("h100-sxm"), load_model("llama-3-8b"), "keyformer", 0.5, qps=5.0, requests=10,
                   prompt=256, gen=16, progress=True)
    assert res.completed == 10 and res.config["hw"] == "h100-sxm" and res.config["model"] == "llama-3-8b"
    assert "serve llama-3-8b keyformer on h100-sxm" in capsys.readouterr().err  # the progress bar, on stderr


def test_simulate_rejects_unknown_options():
    with pytest.raises(ValueError, match="unknown serve option"):
        simulate("h100-sxm", "llama-3-8b", qps=1.0, requests=1, prompt=8, gen=8, bogus=1)


# ---- CLI ------------------------------------------------------------------------------------------

BASE = ["--hw", "h100-sxm", "--model", "llama-3-8b", "--no-progress"]


def test_cli_json_has_the_documented_keys(capsys):
    rc = main(BASE + ["--policy", "keyformer", "--cache-ratio", "0.5", "--qps", "20", "--requests", "50",
                      "--prompt", "512", "--gen", "64", "--json", "--seed", "3"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("ttft_s", "tpot_s", "e2e_s", "itl_s", "queue_s"):
        assert set(out[key]) == {"mean", "p50", "p90", "p99"}
    for key in ("tokens_per_s", "requests_per_s", "completed", "dropped", "peak_memory_bytes", "mean_batch",
                "preemptions"):
        assert key in out
    assert out["completed"] == 50 and out["config"]["seed"] == 3


def test_cli_infinite_qps_is_strict_json(capsys):
    assert main(BASE + ["--qps", "inf", "--requests", "3", "--prompt", "64", "--gen", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["config"]["qps"] == "inf"


def test_cli_human_report_and_files(tmp_path, capsys):
    timeline, per_request = tmp_path / "tl.csv", tmp_path / "req.csv"
    rc = main(BASE + ["--qps", "10", "--requests", "20", "--prompt", "256", "--gen", "32", "--chunked-prefill",
                      "512", "--timeline", str(timeline), "--per-request", str(per_request)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "TTFT" in text and "output token throughput" in text
    import pandas as pd
    assert len(pd.read_csv(per_request)) == 20
    tl = pd.read_csv(timeline)
    assert {"t_s", "kv_bytes", "batch", "waiting"} <= set(tl.columns) and (tl.prefill_tokens + tl.decodes <= 512).all()


def test_cli_replays_an_arrivals_file(tmp_path, capsys):
    path = tmp_path / "reqs.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n0.0,100,10\n0.5,2000,3\n0.2,50,20\n")
    assert main(BASE + ["--arrivals", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["completed"] == 3 and out["config"]["requests"] == 3


@pytest.mark.parametrize("args,message", [
    (["--hw", "no-such-gpu", "--model", "llama-3-8b", "--prompt", "8", "--gen", "8"], "no-such-gpu"),
    (BASE + ["--prompt", "8", "--gen", "8", "--cache-ratio", "1.5"], "cache-ratio"),
    (BASE + ["--arrivals", "missing.csv"], "missing.csv"),
    (BASE + ["--prompt", "8", "--gen", "8", "--trace", "no/such/trace"], "trace folder"),
    (BASE + ["--prompt", "8", "--gen", "8", "--kv-dtype", "fp7"], "fp7"),
    (BASE + ["--prompt", "8"], "--gen"),
    (BASE + ["--prompt", "8", "--gen", "8", "--qps", "0"], "--qps"),
])
def test_cli_user_mistakes_give_one_line_and_exit_2(args, message, capsys):
    code = main(args)
    assert_one_line_error(code, capsys.readouterr().err, message)


def test_library_errors_name_fields_the_cli_names_flags(capsys):
    from sim.serve import ServeConfig
    with pytest.raises(ValueError, match=r"^qps must be > 0 \(or inf\), got 0"):
        ServeConfig(hw="l4", model="gpt2", qps=0)
    with pytest.raises(ValueError, match=r"^block_size must be >= 1, got 0"):
        ServeConfig(hw="l4", model="gpt2", block_size=0)
    code = main(BASE + ["--prompt", "8", "--gen", "8", "--block-size", "0"])
    assert_one_line_error(code, capsys.readouterr().err, "--block-size must be >= 1, got 0")
