"""sim.engine.timing: the vectorised operator timing and the DES's scalar step time are one formula."""
import numpy as np
import pytest

from sim.engine import kernel_seconds, make_ctx, make_setup, step_time_scalar, time_ops
from sim.ops import forward_ops


@pytest.mark.parametrize("hw", ["h200-sxm", "cpu-local"])
@pytest.mark.parametrize("profile", ["fused", "hf", "hf-eager", "kvsim-eager", "trtllm"])
@pytest.mark.parametrize("policy", ["full", "keyformer"])
def test_scalar_step_time_is_the_vectorised_one(hw, profile, policy):
    s = make_setup(hw, "llama-3-8b", policy, profile=profile)
    for phase, new, past in (("decode", 1.0, 1500.0), ("prefill", 512.0, 0.0)):
        ops = forward_ops(make_ctx(s, phase, 4.0, 1.0, new, past, 0.5, 0.3))
        vectorised = float(np.asarray(time_ops(s, ops).step_time))
        assert step_time_scalar(s, ops) == pytest.approx(vectorised, rel=1e-12)
        assert step_time_scalar(s, ops, host=False) == pytest.approx(vectorised - s.host_s, rel=1e-12)


def test_kernel_seconds_is_at_least_the_launches():
    s = make_setup("h200-sxm", "llama-2-7b", "h2o")
    ops = forward_ops(make_ctx(s, "decode", 1.0, 1.0, 1.0, 100.0, 0.5, 0.3))
    flops = np.array([float(op.flops) for op in ops])
    nbytes = np.array([float(op.weight_bytes + op.act_bytes + op.kv_read_bytes + op.kv_write_bytes) for op in ops])
    t_compute, t_memory, seconds = kernel_seconds(s, ops, flops, nbytes)
    launches = np.array([op.launches for op in ops]) * s.launch_s
    assert np.all(seconds >= launches - 1e-18) and np.all(t_compute >= 0) and np.all(t_memory >= 0)
