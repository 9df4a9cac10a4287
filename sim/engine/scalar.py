"""The DES's step time on Python floats: `kernel_seconds` (sim.opcost.op_costs plus launches) for a list of
scalar ops, the same operations on the same numbers in the same order, so the result is the numpy path's
bit for bit (tests/sim/test_engine_scalar.py compares the two on every shipped GPU, profile and policy).

Why it exists: a DES step times a dozen scalar ops, and the numpy path spends ~35 calls on 4- to 15-element
arrays whose overhead is the step's cost (about 130 of a 330 us step; issue 29). Here each op is a few float
operations. It covers the case the DES runs: every op field a Python number, peaks per setup (not per
point), and a device whose curves are saturating (every datasheet device) without the CPU-calibrated
tables (skinny-GEMM, fresh-allocation); `scalar_step_seconds` returns None otherwise and the caller takes
the numpy path. IEEE-754 division, multiplication, addition and max/min of two doubles are exact
operations, identical in numpy's loops and in Python; the per-op sum stays numpy's `np.dot` (its summation
order is the BLAS kernel's).
"""
from __future__ import annotations

import operator

import numpy as np

from hwmodels.curves import SaturatingCurve
from hwmodels.device import Device
from sim.opcost import kernel_hosts, kernels_of

_ARRAY_FIELDS = ("flops", "weight_bytes", "act_bytes", "kv_read_bytes", "kv_write_bytes", "launches", "rows",
                 "compute_eff", "compute_scale", "bw_scale", "fresh_tensor_bytes")
_op_fields = operator.attrgetter(*_ARRAY_FIELDS)


def _saturating(curve: SaturatingCurve, size: float) -> float:
    """SaturatingCurve.__call__ on one number (its 0-d branch: the same two operations)."""
    s = max(size, 1.0)
    return curve.max_fraction * s / (s + curve.half_size)


def _device_covered(s) -> bool:
    hw = s.hw
    if not isinstance(hw, Device):         # a duck-typed device: only the numpy path knows its methods
        return False
    if type(hw.bw_curve) is not SaturatingCurve or type(hw.compute_curve) is not SaturatingCurve:
        return False
    if hw.tables.gemm_rows_curve is not None or hw.tables.fresh_alloc_curve is not None:
        return False
    return not (isinstance(s.peak_gemm, np.ndarray) or isinstance(s.peak_vector, np.ndarray))


_COVERED: dict = {}     # id(setup) -> (setup, _device_covered(setup)): a setup is asked every step


def covers(s, ops) -> bool:
    """Whether the float path applies to these ops on this setup (else: the numpy path)."""
    hit = _COVERED.get(id(s))
    if hit is None or hit[0] is not s:
        if len(_COVERED) > 256:
            _COVERED.clear()
        hit = _COVERED[id(s)] = (s, _device_covered(s))
    if not hit[1]:
        return False
    array = np.ndarray
    for op in ops:
        for value in _op_fields(op):
            if isinstance(value, array):
                return False
    return True


def scalar_step_seconds(s, ops, host: bool = True) -> float | None:
    """sim.engine.timing.step_time_scalar on floats, or None when `covers` says no."""
    if not covers(s, ops):
        return None
    hw = s.hw
    bw_curve, compute_curve = hw.bw_curve, hw.compute_curve
    ref = hw.compute_reference_peak
    by_kind = {"scores": s.attn_scores_factor, "values": s.attn_values_factor}
    streams = not (s.attn_scores_factor == 1.0 and s.attn_values_factor == 1.0) or any(
        op.bw_scale is not None for op in ops)
    flops = [float(op.flops) for op in ops]
    nbytes = [float(op.weight_bytes + op.act_bytes + op.kv_read_bytes + op.kv_write_bytes) for op in ops]
    t_compute = []
    for op, f in zip(ops, flops):
        peak = s.peak_gemm if op.gemm else s.peak_vector
        t = f / peak
        if op.gemm or op.matmul:            # opcost.compute_efficiency: the curve at the time-at-peak size
            f1 = max(f, 1.0)
            size = f1 if ref is None else f1 * (ref / peak)
            t = f / (peak * _saturating(compute_curve, max(size, 1.0)))
            if s.stream_flops > 0:
                t = min(t, f / s.stream_flops)
        if op.compute_eff is not None:      # opcost._own_rates
            own = float(op.compute_eff)
            if own == own:                  # NaN: the device's own rate
                t = f / (peak * op.compute_eff)
        if op.compute_scale is not None:
            t = t / op.compute_scale
        t_compute.append(t)
    hosts = kernel_hosts(ops)
    kernels = kernels_of(hosts) if hosts is not None else {}
    sizes = list(nbytes)
    for h, inside in kernels.items():      # a kernel streams all its ops' bytes: one size on the curve
        total = nbytes[h] + sum(nbytes[i] for i in inside)
        for i in (h, *inside):
            sizes[i] = total
    bw = hw.memory_bw
    t_memory = []
    for op, b, size in zip(ops, nbytes, sizes):
        eff = _saturating(bw_curve, max(size, 1.0))
        if streams:                         # timing.stream_factors
            factor = by_kind.get(op.kv_stream, 1.0)
            if op.bw_scale is not None:
                factor = factor * op.bw_scale
            eff = eff * factor
        t_memory.append(b / (bw * eff))
    for h, inside in kernels.items():
        for i in inside:
            t_compute[h] += t_compute[i]
            t_memory[h] += t_memory[i]
        for i in inside:
            t_compute[i] = t_memory[i] = 0.0
    per_occurrence = []
    for op, tc, tm in zip(ops, t_compute, t_memory):
        per_launch = s.launch_s
        if s.switch_s:                      # timing.launch_costs
            per_launch = s.launch_s + s.switch_s * (op.gemm and op.weight_bytes > 0)
        per_occurrence.append(max(tc, tm) + float(op.launches) * per_launch)
    n_layers = s.model.n_layers
    total = float(np.dot(per_occurrence, [n_layers if op.per_layer else 1.0 for op in ops]))
    return total + (s.host_s if host else 0.0)
