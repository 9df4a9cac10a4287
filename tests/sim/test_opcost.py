"""The operator cost rule (sim.opcost): physics that must hold over devices, models and shapes."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.engine import evaluate, make_ctx, make_setup, predict, step_time_scalar, time_ops
from sim.kvlen import EVICTING
from sim.models import load_model
from sim.opcost import kernel_hosts
from sim.ops import BYTE_FIELDS, Op, forward_ops
from tests.sim.conftest import ToyDevice, real_device_names


def devices():
    names = real_device_names()
    if not names:
        return [ToyDevice()]
    from hwmodels import load_device
    return [load_device(n) for n in names]


DEVICES = devices()
HBM = [d for d in DEVICES if "HBM" in getattr(d, "description", "")]
MODELS = ["llama-2-7b", "llama-3-8b", "mpt-7b", "gpt-j-6b", "smollm2-135m", "llama-2-70b", "stories260k", "gpt2",
          "mixtral-8x7b", "falcon-40b"]
# multi-head models of 1B+ parameters: one KV head per query head, so at 4k tokens the KV cache is a large
# share of a decode step's bytes. (GQA models, and GPT-2 beyond its 1k positions, save about what the
# one selection launch per layer costs at 4k: docs/sim.md "Fusion".)
MHA_MODELS = ["llama-2-7b", "llama-2-13b", "mpt-7b", "gpt-j-6b", "opt-13b", "cerebras-gpt-6.7b"]
PROFILES = ["fused", "hf-eager", "kvsim-eager"]
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def tpot(hw, model, policy, profile="fused", **kw):
    return evaluate(hw, model, policy, profile=profile, with_capacity=False, **kw)["tpot_s"][0]


@SETTINGS
@given(hw=st.sampled_from(DEVICES), model=st.sampled_from(MODELS), policy=st.sampled_from(EVICTING),
       profile=st.sampled_from(PROFILES), batch=st.integers(1, 256), prompt=st.integers(16, 32768),
       gen=st.integers(2, 2048), ratios=st.lists(st.floats(0.01, 1.0), min_size=2, max_size=2),
       kv_dtype=st.sampled_from(["bf16", "fp8"]))
def test_tpot_never_falls_as_the_cache_ratio_grows(hw, model, policy, profile, batch, prompt, gen, ratios, kv_dtype):
    lo, hi = sorted(ratios)
    kw = dict(batch=batch, prompt=prompt, gen=gen, kv_dtype=kv_dtype)
    small = evaluate(hw, model, policy, profile=profile, cache_ratio=lo, with_capacity=False, _keep_ops=True, **kw)
    large = evaluate(hw, model, policy, profile=profile, cache_ratio=hi, with_capacity=False, _keep_ops=True, **kw)
    assert small["tpot_s"][0] <= large["tpot_s"][0] * (1 + 1e-12)
    # evicting more never moves more bytes
    moved = lambda r: sum(r["_decode"].fields[f].sum() for f in BYTE_FIELDS)
    assert moved(small) <= moved(large) * (1 + 1e-12)


@pytest.mark.skipif(not HBM, reason="no HBM device shipped")
@SETTINGS
@given(hw=st.sampled_from(HBM or [None]), model=st.sampled_from(MHA_MODELS), prompt=st.integers(4096, 65536),
       gen=st.integers(2, 4096), kv_dtype=st.sampled_from(["bf16", "fp16", "fp8"]),
       weight_dtype=st.sampled_from(["bf16", "fp8", "int8", "int4"]))
def test_keyformer_at_a_tenth_beats_full_attention_at_batch_one_and_long_context(hw, model, prompt, gen, kv_dtype,
                                                                                weight_dtype):
    kw = dict(batch=1, prompt=prompt, gen=gen, kv_dtype=kv_dtype, weight_dtype=weight_dtype)
    assert tpot(hw, model, "keyformer", cache_ratio=0.1, **kw) < tpot(hw, model, "full", **kw)


def kernels(timed, ops, n_layers):
    """Per kernel (an op and those inside it): FLOPs, bytes, launches and seconds per occurrence."""
    hosts = kernel_hosts(ops) or list(range(len(ops)))
    out = {}
    for i, (op, h) in enumerate(zip(ops, hosts)):
        mult = n_layers if op.per_layer else 1.0
        k = out.setdefault(h, dict(flops=0.0, bytes=0.0, launches=0.0, time=0.0, name=ops[h].name))
        k["flops"] += float(timed.fields["flops"][i]) / mult
        k["bytes"] += sum(float(timed.fields[f][i]) for f in BYTE_FIELDS) / mult
        k["launches"] += op.launches
        k["time"] += float(timed.time[i]) / mult
    return out.values()


@SETTINGS
@given(hw=st.sampled_from(DEVICES), model=st.sampled_from(MODELS), profile=st.sampled_from(PROFILES),
       policy=st.sampled_from(["full", "h2o", "keyformer", "window"]), phase=st.sampled_from(["prefill", "decode"]),
       batch=st.integers(1, 64), new=st.integers(1, 512), past=st.integers(0, 8192),
       weight_dtype=st.sampled_from(["bf16", "fp8", "int4", "fp32"]))
def test_a_tiny_op_costs_its_launches_plus_its_bytes(hw, model, profile, policy, phase, batch, new, past, weight_dtype):
    s = make_setup(hw, model, policy, weight_dtype, "bf16", profile)
    ctx = make_ctx(s, phase, float(batch), 1.0, 1.0 if phase == "decode" else float(new), float(past), 0.5, 0.3)
    ops = forward_ops(ctx)
    timed = time_ops(s, ops)
    assert step_time_scalar(s, ops) == pytest.approx(float(timed.step_time), rel=1e-9)   # one rule, two paths
    per_launch = s.launch_s + s.switch_s
    for k in kernels(timed, ops, s.model.n_layers):
        if k["flops"] < 1e6 and k["bytes"] < 1e6:
            small_transfer = k["bytes"] / (hw.memory_bw * float(hw.bw_efficiency(max(k["bytes"], 1.0))))
            assert k["time"] <= (k["launches"] * per_launch + small_transfer) * (1 + 1e-9), k["name"]


@pytest.mark.parametrize("hw", DEVICES, ids=lambda d: d.name)
def test_decode_attention_gemvs_are_bandwidth_bound(hw):
    for model in ("llama-2-7b", "llama-3-8b", "stories260k"):
        for past in (16, 4096):
            p = predict(hw, model, 1, past, 2, "keyformer", 0.5, profile="fused")   # ideal kernels: the roofline
            dec = p.decode_ops.query("step == 'first'").set_index("op")
            assert dec.loc["attn_scores", "bound"] == "memory", (model, past)
            assert dec.loc[["softmax", "attn_v", "score_update"], "bound"].eq("fused").all()
            assert dec.loc[["norms", "select_evict", "kv_write"], "bound"].eq("memory").all()


def test_ops_below_the_ridge_pay_no_compute_ramp():
    """A norm of 1.3 MFLOP used to pay the GEMM ramp (~6 us per layer on an H200): now its launches and bytes."""
    if "h200-sxm" not in real_device_names():
        pytest.skip("h200-sxm not shipped")
    s = make_setup("h200-sxm", "llama-2-7b", "keyformer", profile="fused")   # the device file's launch cost
    ctx = make_ctx(s, "decode", 1.0, 1.0, 1.0, 409.0, 0.1, 0.3)
    timed = time_ops(s, forward_ops(ctx))
    t = dict(zip(timed.names, timed.time / s.model.n_layers))
    hw = s.hw
    norm_bytes = 2 * 4096 * 2 + 2 * 2 * 4096 * 2
    assert t["norms"] == pytest.approx(2 * hw.launch_overhead_s + norm_bytes / (hw.memory_bw * hw.bw_efficiency(norm_bytes)))
    assert t["select_evict"] < 1.2 * hw.launch_overhead_s           # one small kernel per layer
    assert t["softmax"] == 0.0 and t["score_update"] == 0.0       # inside the flash kernel


def test_fused_kernel_members_share_one_roofline(toy_device):
    s = make_setup(toy_device, "llama-2-7b", "full")
    ops = [Op("a", True, flops=1e9, act_bytes=1e6, matmul=True), Op("b", True, flops=1e9, act_bytes=1e6,
                                                                      fused_into="a", launches=0.0)]
    timed = time_ops(s, ops)
    assert timed.time[1] == 0.0 and timed.t_memory[1] == 0.0
    alone = time_ops(s, [Op("ab", True, flops=2e9, act_bytes=2e6)])
    # one pass over 2 MB at that size's bandwidth, the two ops' compute added
    assert float(timed.t_memory[0]) == pytest.approx(float(alone.t_memory[0]))
    with pytest.raises(ValueError, match="no earlier op"):
        time_ops(s, [Op("b", True, fused_into="a")])
