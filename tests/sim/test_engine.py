"""The analytic engine: operator tables, decode mean vs a step loop, DES entries, memory, seams."""
import subprocess
import sys

import numpy as np
import pytest

from sim import engine, kvlen
from sim.engine import TABLE_COLUMNS, decode_step_time, evaluate, memory_bytes, mixed_step_time, predict, prefill_time
from sim.models import load_model
from sim.ops import Op
from sim.profiles import PROFILES, Profile, get_profile, register_profile


def step_loop_tpot(hw, model, batch, prompt, gen, policy, ratio, beams=1, **kw):
    """The reference: every decode step evaluated on its own, then averaged."""
    steps = [decode_step_time(hw, model, np.full(batch, kvlen.kv_tokens(policy, prompt, s, ratio)), policy=policy,
                              beams=beams, **kw) for s in range(gen - 1)]
    return float(np.mean(steps))


@pytest.mark.parametrize("batch, prompt, gen", [(1, 512, 2), (1, 512, 3), (1, 4096, 2048), (16, 1000, 700),
                                                (64, 128, 4000), (4, 30000, 300)])
def test_mean_tpot_matches_a_step_by_step_loop(device, batch, prompt, gen):
    for policy, ratio in (("full", 1.0), ("keyformer", 0.4), ("window", 0.2)):
        got = predict(device, "llama-3-8b", batch, prompt, gen, policy, ratio).tpot_s
        want = step_loop_tpot(device, "llama-3-8b", batch, prompt, gen, policy, ratio)
        assert got == pytest.approx(want, rel=0.005), (policy, got, want)


def test_gen_one_has_no_decode_steps(device):
    p = predict(device, "gpt2", 2, 100, 1, "full", 1.0)
    assert p.tpot_s == 0 and p.e2e_s == pytest.approx(p.ttft_s)
    assert p.tokens_per_s == pytest.approx(2 / p.ttft_s)


def test_operator_tables_have_every_op_and_column(device):
    p = predict(device, "llama-3-8b", 4, 2048, 256, "keyformer", 0.5, profile="fused")   # the flash-kernel rows
    assert list(p.prefill_ops.columns) == TABLE_COLUMNS
    assert list(p.decode_ops.columns) == ["step"] + TABLE_COLUMNS
    core = {"qkv_proj", "attn_scores", "softmax", "attn_v", "out_proj", "mlp", "norms", "lm_head", "kv_write"}
    assert core | {"score_update", "select_topk", "compact"} <= set(p.prefill_ops["op"])
    assert core | {"score_update", "select_evict"} <= set(p.decode_ops["op"])
    assert set(p.decode_ops["step"]) == {"first", "mean", "last"}
    assert set(p.decode_ops["bound"]) <= {"compute", "memory", "fused"}
    # the flash kernel: softmax, attn x V and (decode) the score update run inside attn_scores' kernel
    dec = p.decode_ops.query("step == 'mean'").set_index("op")
    assert set(dec.index[dec["bound"] == "fused"]) == {"softmax", "attn_v", "score_update"}
    assert (dec.loc[["softmax", "attn_v", "score_update"], "time_s"] == 0).all()
    # the table adds up to the step: ops + host overhead
    mean = p.decode_ops[p.decode_ops["step"] == "mean"]
    assert mean["time_s"].sum() + device.host_overhead_s == pytest.approx(p.tpot_s, rel=1e-9)
    assert p.prefill_ops["time_s"].sum() + device.host_overhead_s == pytest.approx(p.ttft_s, rel=1e-9)


def test_policy_ops_by_policy(device):
    ops = lambda policy: set(predict(device, "mpt-7b", 1, 1024, 64, policy, 0.5).decode_ops["op"])
    assert "score_update" not in ops("full") | ops("window") | ops("streaming")
    assert {"score_update", "select_evict"} <= ops("h2o") & ops("keyformer")
    flops = lambda policy: predict(device, "mpt-7b", 1, 1024, 64, policy, 0.5).decode_ops.query(
        "step == 'mean' and op == 'score_update'")["flops"].item()
    assert flops("keyformer") > flops("h2o") > 0          # Gumbel noise and a second softmax


def test_kv_traffic_follows_the_policy(device):
    m = load_model("llama-3-8b")
    full = predict(device, m, 1, 1000, 101, "full", 1.0)
    kv_read = lambda p, step: p.decode_ops.query(f"step == '{step}'")["kv_read_bytes"].sum()
    per_token = m.kv_bytes_per_token("bf16")
    assert kv_read(full, "first") == pytest.approx(1000 * per_token)
    assert kv_read(full, "last") == pytest.approx(1099 * per_token)
    ev = predict(device, m, 1, 1000, 101, "h2o", 0.25)
    assert kv_read(ev, "first") == kv_read(ev, "last") == pytest.approx(250 * per_token)
    # the prefill still runs full attention and writes all n tokens
    assert ev.prefill_ops.query("op == 'kv_write'")["kv_write_bytes"].item() == pytest.approx(1000 * per_token)


def test_beams_multiply_rows_but_not_output_tokens(device):
    wide = predict(device, "mpt-7b", 1, 1024, 128, "full", 1.0, beams=4)
    rows = predict(device, "mpt-7b", 4, 1024, 128, "full", 1.0)
    assert wide.tpot_s == pytest.approx(rows.tpot_s)
    assert wide.peak_memory_bytes == pytest.approx(rows.peak_memory_bytes)
    assert wide.tokens_per_s == pytest.approx(rows.tokens_per_s / 4)


@pytest.mark.parametrize("profile", ["fused", "hf-eager", "kvsim-eager", "hf"])
def test_evaluate_matches_predict_and_mixed_dtypes_match_separate_runs(device, profile):
    """Per-point dtypes give each point's own answer under every profile (hf-eager's fp32-logit upcast
    exists only for 16-bit activations: one op with per-point bytes and launches)."""
    rng = np.random.default_rng(1)
    n = 40
    batch, prompt, gen = rng.integers(1, 64, n), rng.integers(16, 8000, n), rng.integers(1, 2000, n)
    ratio = rng.uniform(0.05, 1, n)
    kv = np.array(["bf16", "fp8", "int4", "fp16"], dtype=object)[rng.integers(0, 4, n)]
    wd = np.array(["bf16", "fp8", "int8", "fp32"], dtype=object)[rng.integers(0, 4, n)]
    mixed = evaluate(device, "llama-3-8b", "keyformer", batch=batch, prompt=prompt, gen=gen, cache_ratio=ratio,
                     kv_dtype=kv, weight_dtype=wd, profile=profile)
    for i in range(0, n, 7):
        one = predict(device, "llama-3-8b", int(batch[i]), int(prompt[i]), int(gen[i]), "keyformer", ratio[i],
                      kv_dtype=kv[i], weight_dtype=wd[i], profile=profile)
        assert mixed["tpot_s"][i] == pytest.approx(one.tpot_s, rel=1e-9)
        assert mixed["ttft_s"][i] == pytest.approx(one.ttft_s, rel=1e-9)
        assert mixed["max_batch"][i] == one.max_batch
        assert mixed["peak_memory_bytes"][i] == pytest.approx(one.peak_memory_bytes)


def test_des_entries_agree_with_the_request_path(device):
    p = predict(device, "llama-3-8b", 1, 777, 2, "full", 1.0)
    assert prefill_time(device, "llama-3-8b", [(777, 0)]) == pytest.approx(p.ttft_s, rel=1e-9)
    assert decode_step_time(device, "llama-3-8b", [777]) == pytest.approx(p.tpot_s, rel=1e-9)
    dec = decode_step_time(device, "llama-3-8b", [500, 900, 1300])
    pre = prefill_time(device, "llama-3-8b", [(256, 0), (128, 512, False)])
    both = mixed_step_time(device, "llama-3-8b", [500, 900, 1300], [(256, 0), (128, 512, False)])
    assert max(dec, pre) < both < dec + pre          # one host overhead and one pass over the weights
    # heterogeneous lengths cost what their total costs (one batched attention kernel)
    assert dec == pytest.approx(decode_step_time(device, "llama-3-8b", [900, 900, 900]))
    # a chunk that completes its prompt pays the policy's selection and compaction
    done = prefill_time(device, "llama-3-8b", [(512, 512)], policy="keyformer", cache_ratio=0.5)
    partial = prefill_time(device, "llama-3-8b", [(512, 512, False)], policy="keyformer", cache_ratio=0.5)
    assert done > partial


# Timed in a fresh interpreter, like the DES runs: no torch there. In the test process torch (loaded by
# other tests) leaves OpenMP threads spinning under OMP_WAIT_POLICY=ACTIVE, which doubles the CPU time of
# pure-numpy code on 2 cores (measured: 28 vs 51 us per call). The step is timed against a fixed probe of the
# same kind of work (small numpy arrays and Python arithmetic) in the same interpreter: on this shared VM the
# same code ran 30 us per step in one session and 90-150 us in the next, with nothing else running (the host's
# speed), while the ratio to the probe stayed within about +-40%.
_TIME_DECODE_STEP = """
import sys, time
import numpy as np
from hwmodels import load_device
from sim.engine import decode_step_time
device, kv, profile = load_device(sys.argv[1]), np.full(32, 3000.0), sys.argv[2]
decode_step_time(device, "llama-3-8b", kv, policy="keyformer", profile=profile)

def probe():
    a = np.arange(12, dtype=float)
    s = 0.0
    for i in range(20):
        b = np.maximum(a * 1.5, 1.0) / (a + 2.0)
        s += float(b.sum()) + sum(x * 0.5 for x in range(10))
    return s

best = ref = float("inf")
for _ in range(10):          # best of 10, in this thread's CPU time: the machine's cores are shared
    t0 = time.thread_time()
    for _ in range(200):
        decode_step_time(device, "llama-3-8b", kv, policy="keyformer", profile=profile)
    best = min(best, (time.thread_time() - t0) / 200)
    t0 = time.thread_time()
    for _ in range(200):
        probe()
    ref = min(ref, (time.thread_time() - t0) / 200)
print(best, ref)
"""

# 2.5x the usual step / probe ratio (measured 0.73-0.93 for fused, 1.15-1.38 for the trtllm default, which adds
# its kernel-family rates to every step): a real regression of the DES hot path still fails
DES_STEP_BOUND = {"fused": 2.0, "trtllm": 3.2}


@pytest.mark.parametrize("profile", sorted(DES_STEP_BOUND))
def test_decode_step_time_is_fast_enough_for_a_des(device, profile):
    if device.name == "toy":
        pytest.skip("timed on shipped devices (the toy's efficiency curves are not what the DES runs)")
    bound = DES_STEP_BOUND[profile]
    best = float("inf")
    for _ in range(3):       # best of up to three fresh interpreters
        out = subprocess.run([sys.executable, "-c", _TIME_DECODE_STEP, str(device.source_path), profile],
                             capture_output=True, text=True, check=True).stdout
        step, ref = (float(x) for x in out.split()[-2:])
        best = min(best, step / ref)
        if best < bound:
            break
    assert best < bound, f"{profile}: {best:.2f} x the probe per call ({step * 1e6:.1f} us)"


def test_kv_override_seam(device):
    m = load_model("llama-3-8b")
    prompt, gen = 1000, 200
    formula = predict(device, m, 2, prompt, gen, "h2o", 0.3)
    same = np.full((gen + 1, m.n_layers), 300.0)
    traced = predict(device, m, 2, prompt, gen, "h2o", 0.3, kv_override=same)
    assert traced.tpot_s == pytest.approx(formula.tpot_s, rel=1e-9)
    assert traced.inputs["kv_source"] == "trace"
    # a growing full-attention trace reproduces the step loop exactly
    grow = (prompt + np.arange(gen + 1, dtype=float))[:, None].repeat(m.n_layers, 1)
    full = predict(device, m, 2, prompt, gen, "full", 1.0, kv_override=grow)
    assert full.tpot_s == pytest.approx(step_loop_tpot(device, m, 2, prompt, gen, "full", 1.0), rel=1e-9)
    # a trace that follows the formula reproduces the formula's memory and capacity
    full_formula = predict(device, m, 2, prompt, gen, "full", 1.0)
    assert full.peak_memory_bytes == full_formula.peak_memory_bytes and full.max_batch == full_formula.max_batch
    assert traced.peak_memory_bytes == formula.peak_memory_bytes and traced.max_batch == formula.max_batch
    # per-layer lengths matter: half the layers keeping more costs more than all keeping less
    uneven = same.copy()
    uneven[:, ::2] = 600.0
    assert predict(device, m, 2, prompt, gen, "h2o", 0.3, kv_override=uneven).tpot_s > traced.tpot_s
    with pytest.raises(ValueError, match="kv_override must have shape"):
        predict(device, m, 2, prompt, gen, "h2o", 0.3, kv_override=np.ones((gen + 1, 3)))
    with pytest.raises(ValueError, match="non-negative"):
        predict(device, m, 2, prompt, gen, "h2o", 0.3, kv_override=-same)


def test_memory_and_max_batch(device):
    m = load_model("llama-3-8b")
    p = predict(device, m, 1, 4096, 1024, "full", 1.0)
    mem = lambda b: memory_bytes(m, b, kvlen.peak_kv_tokens("full", 4096, 1024, 1.0), prompt=4096)
    assert p.peak_memory_bytes == pytest.approx(mem(1))
    if p.max_batch_all_at_once > 0:      # every request at its peak at once
        assert mem(p.max_batch_all_at_once) <= device.memory_bytes < mem(p.max_batch_all_at_once + 1)
    # continuous batching holds more: the average request holds n + gen/2 tokens, not n + gen
    assert p.max_batch >= p.max_batch_all_at_once
    kv_part = mem(3) - mem(2)
    assert kv_part >= (4096 + 1024) * m.kv_bytes_per_token("bf16")     # one more sequence's KV at least
    # evicting policies hold max(n, k+1) tokens: the prefill materialises the whole prompt
    assert kvlen.peak_kv_tokens("keyformer", 4096, 1024, 0.5) == 4096
    assert kvlen.peak_kv_tokens("keyformer", 100, 1024, 1.0) == 101


def test_a_model_that_does_not_fit_has_max_batch_zero(device):
    p = predict(device, "llama-2-70b", 1, 1024, 16, "full", 1.0)
    if p.extra["weight_bytes"] > device.memory_bytes:
        assert p.max_batch == 0 and p.max_batch_tokens_per_s == 0 and not p.extra["fits"]


def test_profiles_can_add_operators_without_touching_the_engine(device):
    def copy_cache(ctx):   # e.g. an eager stack concatenating the cache every step
        kv = 2 * ctx.rows * ctx.model.n_kv_heads * ctx.past_tokens * ctx.model.head_dim * ctx.kvb
        return [Op("cache_concat", True, kv_read_bytes=kv, kv_write_bytes=kv)]

    register_profile(Profile("test-concat", "fused plus a cache copy per step", launches=get_profile("fused").launches,
                             extra_decode_ops=copy_cache, extra_host_overhead_s=1e-3))
    try:
        base = predict(device, "llama-3-8b", 1, 2048, 64, "full", 1.0, profile="fused")
        slow = predict(device, "llama-3-8b", 1, 2048, 64, "full", 1.0, profile="test-concat")
        assert "cache_concat" in set(slow.decode_ops["op"]) and "cache_concat" not in set(slow.prefill_ops["op"])
        assert slow.tpot_s > base.tpot_s + 1e-3
        assert slow.ttft_s == pytest.approx(base.ttft_s + 1e-3)
    finally:
        PROFILES.pop("test-concat")
    with pytest.raises(ValueError, match="unknown profile"):
        predict(device, "llama-3-8b", 1, 2048, 64, "full", 1.0, profile="test-concat")
    with pytest.raises(ValueError, match="unknown ops"):
        Profile("bad", "x", launches={"no_such_op": 1})


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(cache_ratio=0.0), "cache ratio"), (dict(cache_ratio=1.5), "cache ratio"),
    (dict(recent_ratio=-0.1), "recent ratio"), (dict(batch=0), "batch"), (dict(gen=0), "gen"),
    (dict(policy="sparse"), "unknown policy"), (dict(kv_dtype="fp7"), "unknown dtype"),
])
def test_bad_inputs_raise_value_errors(device, kwargs, fragment):
    args = dict(batch=1, prompt=128, gen=8, policy="h2o", cache_ratio=0.5) | kwargs
    with pytest.raises(ValueError, match=fragment):
        predict(device, "gpt2", **args)


def test_prediction_json_has_the_contract_keys(device):
    import json
    d = json.loads(predict(device, "gpt2", 1, 128, 8, "window", 0.5).to_json())
    for key in ("ttft_s", "tpot_s", "e2e_s", "tokens_per_s", "peak_memory_bytes", "max_batch",
                "max_batch_tokens_per_s", "decode_bound", "kv_bytes_per_token", "policy", "cache_ratio"):
        assert key in d


def _cpu_like_file(tmp_path, with_rows: bool, in_out_points=None):
    import yaml
    from hwmodels import DEVICES_DIR
    data = yaml.safe_load((DEVICES_DIR / "a100-80g-sxm.yaml").read_text())
    data["name"] = ("rows-test" if with_rows else "no-rows-test") + ("-io" if in_out_points else "")
    if with_rows:
        data["gemm_rows_efficiency"] = {"form": "table", "size_unit": "rows", "source": "test",
                                        "points": [[1, 0.001], [4, 0.002], [64, 0.032]]}
    if in_out_points:
        data["gemm_rows_in_out_efficiency"] = {"form": "table", "size_unit": "rows", "source": "test",
                                               "points": in_out_points}
    path = tmp_path / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def test_skinny_gemm_rows_efficiency_caps_weight_gemms(tmp_path):
    # A device whose weight GEMMs reach only a small fraction of peak at few token rows: decode at
    # batch 4 (4 rows through every projection) must slow down by the capped compute time, and a
    # device without the table is unchanged by the mechanism.
    rows_dev, plain_dev = _cpu_like_file(tmp_path, True), _cpu_like_file(tmp_path, False)
    kv = np.full(4, 1000.0)
    slow = decode_step_time(rows_dev, "llama-3-8b", kv, weight_dtype="bf16", kv_dtype="bf16")
    fast = decode_step_time(plain_dev, "llama-3-8b", kv, weight_dtype="bf16", kv_dtype="bf16")
    m = load_model("llama-3-8b")
    gemm_flops = 2 * 4 * m.n_layers * (m.d_model * (m.n_heads + 2 * m.n_kv_heads) * m.head_dim
                                       + m.n_heads * m.head_dim * m.d_model + 3 * m.d_model * m.d_ff)
    assert slow > fast
    assert slow >= gemm_flops / (312e12 * 0.002)          # the capped rate bounds the step from below
    # prefill (many rows: beyond the table, held at its last value) is capped too, at 0.032
    assert prefill_time(rows_dev, "llama-3-8b", [(512, 0)], weight_dtype="bf16", kv_dtype="bf16") > \
        prefill_time(plain_dev, "llama-3-8b", [(512, 0)], weight_dtype="bf16", kv_dtype="bf16")


def test_in_out_rows_table_applies_to_conv1d_projections_only(tmp_path):
    # GPT-2's projections are Conv1D (weights [in, out]): a faster [in, out] table speeds its decode
    # GEMMs up to the table's cap, never past the bandwidth floor; a Llama (nn.Linear) is unchanged, and
    # GPT-2's LM head (a Linear) keeps the [out, in] table.
    rows_dev = _cpu_like_file(tmp_path, True)
    io_dev = _cpu_like_file(tmp_path, True, in_out_points=[[1, 0.004], [4, 0.008], [64, 0.1]])
    kv = np.full(4, 1000.0)
    assert load_model("gpt2").weights_in_out and not load_model("llama-3-8b").weights_in_out
    for model, faster in (("gpt2", True), ("llama-3-8b", False)):
        a = decode_step_time(rows_dev, model, kv, weight_dtype="bf16", kv_dtype="bf16")
        b = decode_step_time(io_dev, model, kv, weight_dtype="bf16", kv_dtype="bf16")
        assert (b < a) if faster else b == pytest.approx(a, rel=1e-12)

    def mean_ops(dev):
        t = predict(dev, "gpt2", 4, 1000, 2, "full", 1.0).decode_ops
        return t[t["step"] == "mean"].set_index("op")["time_s"]
    ops, ops_rows = mean_ops(io_dev), mean_ops(rows_dev)
    assert ops["mlp"] < ops_rows["mlp"] and ops["qkv_proj"] < ops_rows["qkv_proj"]
    assert ops["lm_head"] == pytest.approx(ops_rows["lm_head"], rel=1e-12)


def test_dtype_codes_are_the_names_they_stand_for():
    """evaluate takes a per-point dtype as an array of names or as DtypeCodes (distinct names + index),
    the sweep's factorised column: the same results to the bit."""
    names = np.array(["bf16", "fp8", "bf16", "int8", "fp8"], dtype=object)
    codes = engine.DtypeCodes(("bf16", "fp8", "int8"), np.array([0, 1, 0, 2, 1]))
    kw = dict(batch=np.array([1, 8, 32, 4, 64]), prompt=1024, gen=np.array([64, 128, 256, 512, 32]),
              cache_ratio=0.5, profile="fused")
    a = engine.evaluate("h100-sxm", "llama-2-7b", "h2o", kv_dtype=names, weight_dtype="fp16", **kw)
    b = engine.evaluate("h100-sxm", "llama-2-7b", "h2o", kv_dtype=codes, weight_dtype="fp16", **kw)
    for key in ("ttft_s", "tpot_s", "peak_memory_bytes", "max_batch", "max_batch_tokens_per_s"):
        assert np.array_equal(a[key], b[key]), key
