"""Monotonicity and physical bounds over random design points (hypothesis)."""
import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.engine import evaluate, predict
from sim.kvlen import EVICTING, POLICIES
from tests.sim.conftest import ToyDevice, real_device_names

MODELS = ["llama-2-7b", "llama-3-8b", "mpt-7b", "gpt-j-6b", "smollm2-135m", "llama-2-70b", "mixtral-8x7b", "falcon-40b"]
DTYPES = ["bf16", "fp16", "fp8", "int8", "int4", "fp32"]


def devices():
    names = real_device_names()
    if names:
        from hwmodels import load_device
        return [load_device(n) for n in names]
    return [ToyDevice()]


DEVICES = devices()
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

points = st.fixed_dictionaries({
    "hw": st.sampled_from(DEVICES), "model": st.sampled_from(MODELS), "policy": st.sampled_from(POLICIES),
    "batch": st.integers(1, 512), "beams": st.sampled_from([1, 1, 2, 4]), "prompt": st.integers(1, 65536),
    "gen": st.integers(1, 8192), "cache_ratio": st.floats(0.01, 1.0), "recent_ratio": st.floats(0.0, 1.0),
    "kv_dtype": st.sampled_from(DTYPES), "weight_dtype": st.sampled_from(DTYPES),
})


def run(p, **change):
    q = {**p, **change}
    return evaluate(q["hw"], q["model"], q["policy"], batch=q["batch"], beams=q["beams"], prompt=q["prompt"],
                    gen=q["gen"], cache_ratio=q["cache_ratio"], recent_ratio=q["recent_ratio"],
                    kv_dtype=q["kv_dtype"], weight_dtype=q["weight_dtype"])


def no_greater(a, b):
    """a <= b up to float rounding."""
    return np.all(a <= b * (1 + 1e-9) + 1e-15)


@SETTINGS
@given(points, st.floats(1.0, 8.0))
def test_more_bandwidth_is_never_slower(p, factor):
    faster = dataclasses.replace(p["hw"], memory_bw=p["hw"].memory_bw * factor)
    base, fast = run(p), run(p, hw=faster)
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        assert no_greater(fast[key], base[key]), key


@SETTINGS
@given(points.filter(lambda p: p["policy"] in EVICTING), st.floats(0.01, 1.0))
def test_larger_cache_ratio_is_never_faster(p, other):
    lo, hi = sorted((p["cache_ratio"], other))
    small, large = run(p, cache_ratio=lo), run(p, cache_ratio=hi)
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        assert no_greater(small[key], large[key]), key
    assert no_greater(small["peak_memory_bytes"], large["peak_memory_bytes"])


@SETTINGS
@given(points.filter(lambda p: p["policy"] in EVICTING), st.floats(0.01, 1.0))
def test_capacity_grows_as_the_cache_ratio_falls(p, other):
    lo, hi = sorted((p["cache_ratio"], other))
    assert run(p, cache_ratio=lo)["max_batch"][0] >= run(p, cache_ratio=hi)["max_batch"][0]


@SETTINGS
@given(points)
def test_no_step_beats_the_physical_bound(p):
    """(weights + KV bytes moved) / peak bandwidth is a floor for every step."""
    pred = predict(**{k: v for k, v in p.items()})
    bw = p["hw"].memory_bw
    floor = lambda t: (t["weight_bytes"].sum() + t["kv_read_bytes"].sum() + t["kv_write_bytes"].sum()) / bw
    assert pred.ttft_s >= floor(pred.prefill_ops)
    for step in ("first", "mean", "last"):
        t = pred.decode_ops[pred.decode_ops["step"] == step]
        assert t["time_s"].sum() + p["hw"].host_overhead_s >= floor(t)
    if p["gen"] > 1:
        assert pred.tpot_s >= floor(pred.decode_ops[pred.decode_ops["step"] == "first"]) * (1 - 1e-12)


@SETTINGS
@given(points)
def test_max_batch_fits_and_one_more_does_not(p):
    """All at once: every request of the batch at its peak (sim.capacity; the steady-state max_batch is
    checked in tests/sim/test_capacity.py)."""
    r = run(p)
    mb = int(r["max_batch_all_at_once"][0])
    assert r["max_batch"][0] >= mb
    cap = p["hw"].memory_bytes
    if mb > 0:
        assert run(p, batch=mb)["peak_memory_bytes"][0] <= cap
        assert run(p, batch=mb)["fits"][0]
    assert run(p, batch=mb + 1)["peak_memory_bytes"][0] > cap or mb + 1 > 2**22


def test_full_attention_decode_grows_with_the_prompt():
    hw = DEVICES[0]
    r = evaluate(hw, "llama-2-7b", "full", batch=8, prompt=np.array([512, 1024, 4096, 16384]), gen=256)
    assert np.all(np.diff(r["tpot_s"]) > 0)
    assert np.all(np.diff(r["max_batch"]) <= 0)


@pytest.mark.parametrize("policy", EVICTING)
def test_evicting_policies_beat_full_attention_at_large_batch_and_long_context(policy):
    """Where KV traffic dominates, holding 20% of the prompt must be faster (the paper's regime)."""
    hw = DEVICES[0]
    full = evaluate(hw, "llama-2-7b", "full", batch=16, prompt=8192, gen=2048)
    ev = evaluate(hw, "llama-2-7b", policy, batch=16, prompt=8192, gen=2048, cache_ratio=0.2)
    assert ev["tpot_s"][0] < 0.6 * full["tpot_s"][0]
    assert ev["max_batch"][0] >= full["max_batch"][0]
