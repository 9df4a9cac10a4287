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


def _points(n=40, seed=0):
    rng = np.random.default_rng(seed)
    col = lambda a: np.asarray(a, float)[:, None, None]
    return (col(rng.integers(1, 65, n)), col(rng.choice([1, 4], n)), col(rng.integers(64, 8192, n)),
            col(rng.uniform(0.1, 1.0, n)))


def _same(a, b):
    a, b = np.broadcast_arrays(np.asarray(a, float), np.asarray(b, float))
    return a.shape == b.shape and bool(np.all(a.view(np.int64) == b.view(np.int64)))


@pytest.mark.parametrize("hw", ["h200-sxm", "cpu-local"])
@pytest.mark.parametrize("profile", ["fused", "hf", "trtllm"])
def test_node_partition_gives_the_unpartitioned_numbers_bit_for_bit(hw, profile):
    """A full-attention decode over 9 step nodes: the dense ops are timed at (points, 1, 1) and broadcast;
    every number equals the whole table timed at (points, nodes, 1), to the bit."""
    from sim.engine.timing import _timed_part, node_partition
    s = make_setup(hw, "llama-3-8b", "full", profile=profile)
    batch, beams, prompt, ratio = _points()
    past = prompt + np.linspace(0, 500, 9)[None, :, None]                  # (points, nodes, 1)
    ops = forward_ops(make_ctx(s, "decode", batch, beams, 1.0, past, ratio, 0.3))
    small = node_partition(ops)
    assert small and "qkv_proj" in [ops[i].name for i in small] and "attn_scores" not in [ops[i].name for i in small]
    timed = time_ops(s, ops)
    per_op, t_compute, t_memory, fields = _timed_part(s, ops, 1, ("flops", "kv_read_bytes"))
    assert _same(timed.time, per_op) and _same(timed.t_compute, t_compute) and _same(timed.t_memory, t_memory)
    assert _same(timed.step_time, per_op.sum(0) + s.host_s)
    assert _same(timed.fields["kv_read_bytes"], fields["kv_read_bytes"])


@pytest.mark.parametrize("policy", ["keyformer", "full"])
def test_time_tables_is_time_ops_per_table(policy):
    """Prefill and decode in one pass (an evicting policy: one shape) or apart (full: two shapes): the
    same numbers as one time_ops call per table."""
    from sim.engine.timing import time_tables
    s = make_setup("cpu-local", "llama-2-7b", policy, profile="hf")
    batch, beams, prompt, ratio = _points(seed=1)
    past = prompt * ratio if policy != "full" else prompt + np.linspace(0, 100, 9)[None, :, None]
    pre = forward_ops(make_ctx(s, "prefill", batch, beams, prompt, 0.0, ratio, 0.3))
    dec = forward_ops(make_ctx(s, "decode", batch, beams, 1.0, past, ratio, 0.3))
    for together, alone in zip(time_tables(s, [pre, dec]), (time_ops(s, pre), time_ops(s, dec))):
        assert together.names == alone.names
        assert _same(together.step_time, alone.step_time) and _same(together.time, alone.time)
        assert all(_same(together.fields[f], alone.fields[f]) for f in alone.fields)


def test_a_column_of_scalars_does_not_broadcast_along_the_last_axis():
    """A field that every op of a table leaves scalar (here kv_write_bytes: no op writes KV) stacks as
    (n_ops, 1, 1, 1), not (n_ops,), which would pair op i's bytes with op j's along the last axis."""
    from sim.engine.timing import _timed_part
    from sim.op import Op
    s = make_setup("h200-sxm", "llama-2-7b", "full")
    x = np.arange(1.0, 4.0)[:, None, None] * 1e6
    ops = [Op("a", True, flops=x, act_bytes=x), Op("b", True, flops=2 * x, act_bytes=x), Op("c", False, flops=x)]
    per_op, *_ = _timed_part(s, ops, 1, ())
    assert per_op.shape == (3, 3, 1, 1)


@pytest.mark.parametrize("hw", ["h200-sxm", "cpu-local"])
@pytest.mark.parametrize("policy", ["keyformer", "full", "snapkv"])
def test_table_totals_are_the_per_op_tables_summed_bit_for_bit(hw, policy):
    """The sweep's path (table_totals: sums over ops without per-op tables where the dense ops are timed
    at their own shape) gives time_tables' sums to the bit, for one shape (evicting) and two (growing)."""
    from sim.engine.timing import table_totals, time_tables
    s = make_setup(hw, "llama-2-7b", policy, profile="fused")
    batch, beams, prompt, ratio = _points(seed=2)
    past = prompt * ratio if policy == "keyformer" else prompt + np.linspace(0, 300, 9)[None, :, None]
    pre = forward_ops(make_ctx(s, "prefill", batch, beams, prompt, 0.0, ratio, 0.3))
    dec = forward_ops(make_ctx(s, "decode", batch, beams, 1.0, past, ratio, 0.3))
    keep = ("kv_read_bytes",)
    for lean, timed in zip(table_totals(s, [pre, dec], keep=keep), time_tables(s, [pre, dec], keep=keep)):
        assert _same(lean.step_time, timed.step_time)
        assert _same(lean.t_compute, timed.t_compute.sum(0)) and _same(lean.t_memory, timed.t_memory.sum(0))
        assert _same(lean.fields["kv_read_bytes"], timed.fields["kv_read_bytes"].sum(0))
