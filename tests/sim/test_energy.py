"""sim.energy: energy per token from operator tables (physics and bookkeeping checks)."""
import numpy as np
import pandas as pd
import pytest

from hwmodels import load_device
from hwmodels.platform import load_energy
from sim import energy, engine, parallel

POINT = dict(batch=16, prompt=4096, gen=256)


def _predict(policy="full", ratio=1.0, hw="h100-sxm", model="llama-3-8b", **kw):
    args = {**POINT, **kw}
    return engine.predict(hw, model, args.pop("batch"), args.pop("prompt"), args.pop("gen"), policy, ratio, **args)


def test_hand_computed_table():
    e, dev = load_energy("h100-sxm"), load_device("h100-sxm")
    table = pd.DataFrame([dict(op="mlp", flops=1e12, weight_bytes=1e9, act_bytes=1e6, kv_read_bytes=0.0, kv_write_bytes=0.0),
                          dict(op="attn_scores", flops=1e9, weight_bytes=0.0, act_bytes=0.0, kv_read_bytes=2e9,
                               kv_write_bytes=1e6)])
    parts = energy.step_energy(table, 0.01, e, dev, "fp8", devices=2)
    assert not parts["power_capped"]           # 1.4 TB/s and 100 TFLOP/s per device: under the TDP
    per_byte = e.j_per_byte
    assert parts["weights"] == pytest.approx(1e9 * per_byte)
    assert parts["kv"] == pytest.approx((2e9 + 1e6) * per_byte)
    assert parts["activations"] == pytest.approx(1e6 * per_byte)
    # the weight GEMM at fp8 (the bf16 energy x bf16 peak / fp8 peak, about half on H100), attention at bf16
    fp8 = e.flop_j["bf16"] * dev.peak_flops("bf16") / dev.peak_flops("fp8")
    assert fp8 == pytest.approx(e.flop_j["bf16"] / 2, rel=1e-3)
    assert parts["compute"] == pytest.approx(1e12 * fp8 + 1e9 * e.flop_j["bf16"])
    assert parts["static"] == pytest.approx(e.static_w * 0.01 * 2)
    assert parts["total"] == pytest.approx(sum(parts[p] for p in energy.PARTS))


def test_breakdown_adds_up_and_static_is_a_floor():
    p = _predict("h2o", 0.5)
    s = energy.energy_summary(p)
    parts = s["decode_energy_breakdown_j_per_token"]
    assert sum(parts.values()) == pytest.approx(s["energy_j_per_token"])
    static_w = load_energy("h100-sxm").static_w
    assert s["energy_j_per_token"] >= static_w * p.tpot_s / POINT["batch"]
    assert parts["static"] == pytest.approx(static_w * p.tpot_s / POINT["batch"])
    assert sum(s["prefill_energy_breakdown_j_per_token"].values()) == pytest.approx(s["prefill_energy_j_per_token"])
    # per output token: prefill plus the gen - 1 decode steps, over batch x gen
    total = (s["prefill_energy_j_per_token"] * POINT["batch"] * POINT["prompt"]
             + (POINT["gen"] - 1) * s["energy_j_per_token"] * POINT["batch"])
    assert s["energy_j_per_output_token"] == pytest.approx(total / (POINT["batch"] * POINT["gen"]))


@pytest.mark.parametrize("policy", ["window", "streaming", "h2o", "keyformer"])
def test_evicting_more_never_costs_more_energy(policy):
    values = [energy.energy_summary(_predict(policy, r))["energy_j_per_token"] for r in (0.05, 0.1, 0.2, 0.5, 1.0)]
    assert all(a <= b * (1 + 1e-12) for a, b in zip(values, values[1:])), values
    kv = [energy.energy_summary(_predict(policy, r))["decode_energy_breakdown_j_per_token"]["kv"] for r in (0.1, 1.0)]
    assert kv[0] < kv[1]


def test_weights_energy_is_shared_by_the_batch():
    one = energy.energy_summary(_predict(batch=1))["decode_energy_breakdown_j_per_token"]["weights"]
    many = energy.energy_summary(_predict(batch=16))["decode_energy_breakdown_j_per_token"]["weights"]
    assert many == pytest.approx(one / 16, rel=1e-4)      # embedding rows are read per token


@pytest.mark.parametrize("hw", ["h100-sxm", "h200-sxm", "a100-80g-sxm", "l40s", "mi300x", "b200", "gh200"])
def test_average_power_is_within_the_tdp(hw):
    s = energy.energy_summary(_predict(hw=hw, batch=8, prompt=1024, gen=64))
    assert 0 < s["decode_power_w_per_device"] <= load_energy(hw).tdp_w


def _shipped_with_energy():
    from hwmodels import list_devices
    return [n for n in list_devices() if load_energy(n) is not None]


@pytest.mark.parametrize("hw", _shipped_with_energy())
def test_power_never_exceeds_the_tdp(hw):
    """Property: whatever a step moves and computes in whatever time, its power per device is at most the TDP,
    and a step far beyond it is capped there exactly (compute-bound prefill reaches it)."""
    e, dev = load_energy(hw), load_device(hw)
    rng = np.random.default_rng(0)
    for _ in range(200):
        table = pd.DataFrame([dict(op="mlp", flops=10 ** rng.uniform(6, 16), weight_bytes=10 ** rng.uniform(3, 12),
                                   act_bytes=10 ** rng.uniform(0, 10), kv_read_bytes=10 ** rng.uniform(0, 12),
                                   kv_write_bytes=0.0, link_bytes=10 ** rng.uniform(0, 9))])
        wall, devices = 10 ** rng.uniform(-6, 0), int(rng.integers(1, 9))
        parts = energy.step_energy(table, wall, e, dev, str(rng.choice(["bf16", "fp8", "fp32"])), devices)
        assert parts["total"] / wall / devices <= e.tdp_w * (1 + 1e-9)
        assert parts["total"] == pytest.approx(sum(parts[p] for p in energy.PARTS))
    huge = pd.DataFrame([dict(op="mlp", flops=1e18, weight_bytes=0.0, act_bytes=0.0, kv_read_bytes=0.0, kv_write_bytes=0.0)])
    capped = energy.step_energy(huge, 1.0, e, dev, "bf16")
    assert capped["power_capped"] and capped["total"] == pytest.approx(e.tdp_w)
    s = energy.energy_summary(_predict(hw=hw, batch=64, prompt=4096, gen=16))
    assert s["decode_power_w_per_device"] <= e.tdp_w * (1 + 1e-9)


def test_compute_bound_prefill_reaches_the_tdp():
    """Issue 25: the old model's power never passed ~55% of the TDP, even in compute-bound prefill."""
    p = _predict(batch=64, prompt=4096, gen=16)
    s = energy.energy_summary(p)
    prefill_w = s["prefill_energy_j_per_token"] * 64 * 4096 / p.ttft_s
    assert prefill_w == pytest.approx(load_energy("h100-sxm").tdp_w, rel=1e-6) and s["prefill_power_capped"]


def test_no_energy_data_says_so():
    p = engine.predict("cpu-local", "gpt2", 1, 64, 8, "full", 1.0, weight_dtype="fp32", kv_dtype="fp32")
    s = energy.energy_summary(p)
    assert s["energy_j_per_token"] is None and "no energy data" in s["energy_note"]


def test_tensor_parallelism_costs_energy_not_saves_it():
    """Same bytes and FLOPs over two devices, plus collectives and a second device's static power."""
    one = parallel.predict("h100-sxm", "llama-2-13b", 4, 1024, 64, "full", 1.0)
    two = parallel.predict("h100-sxm", "llama-2-13b", 4, 1024, 64, "full", 1.0, tp=2)
    e1, e2 = (energy.energy_summary(p) for p in (one, two))
    assert e2["energy_j_per_token"] > e1["energy_j_per_token"]
    assert e2["decode_energy_breakdown_j_per_token"]["comm"] > 0 == e1["decode_energy_breakdown_j_per_token"]["comm"]
    assert e2["decode_energy_breakdown_j_per_token"]["weights"] == pytest.approx(
        e1["decode_energy_breakdown_j_per_token"]["weights"], rel=2e-3)


def test_gen_one_has_no_decode_energy():
    s = energy.energy_summary(_predict(gen=1))
    assert s["energy_j_per_token"] is None and s["energy_j_per_output_token"] > 0
