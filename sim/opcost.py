"""The cost of one operator table: the engine's single rule, used by the vectorised request path
(sim.engine.time_ops) and by the DES's scalar step time (sim.engine.step_time_scalar) alike.

Per kernel (an op, plus the ops that run inside it: Op.fused_into)

    time = max(sum of its ops' compute times, its bytes / (bw * bw_eff(kernel bytes) * stream factors))
           + launches * seconds per launch

and an op's compute time is

  - GEMM-class (Op.gemm: weights; Op.matmul: attention's batched GEMMs): the faster of the two kernels
    a library picks by shape: a tiled GEMM, FLOPs / (peak * compute_eff(FLOPs)) capped by the device's
    skinny-GEMM table where it has one, and a streaming (GEMV-style, untiled) kernel on the device's
    non-matrix units, FLOPs / (fp32 peak * the compute plateau), which pays no ramp. Devices with a
    measured skinny-GEMM table have no separate streaming kernel: the table already is what the
    library reaches at each row count, whichever kernel it runs.
  - any other op (norms, softmax, score updates, selection, copies): FLOPs / peak, no ramp.

So every op below the ridge point (FLOPs per byte under peak / bw; for GEMM-class ops on devices with a
streaming kernel, under the streaming rate / bw) is bandwidth-bound, a tiny op costs its launches plus
its bytes at the small-transfer bandwidth (bw_eff of its size), and compute never depends on the memory
bandwidth, so more bandwidth is never slower. docs/sim.md "Operator cost" has the reasoning and sources.
"""
from __future__ import annotations

import numpy as np

STREAM_DTYPE = "fp32"      # the non-matrix (CUDA-core / vector-unit) rate in a device file


def compute_efficiency(hw, flops, peak):
    """Compute efficiency of kernels of `flops` FLOPs running at `peak` FLOP/s.

    A device whose curve names a reference dtype reads it at the same time-at-peak
    (hwmodels Device.compute_equivalent_flops): an fp32 GEMM on an A100 is looked up as the
    bf16 kernel that takes as long at peak, not as a 16x larger one; other devices return FLOPs
    as given."""
    sizes = hw.compute_equivalent_flops(flops, peak)
    fresh = sizes is not flops and isinstance(sizes, np.ndarray) and sizes.dtype == np.float64
    sizes = np.maximum(sizes, 1.0, out=sizes) if fresh else np.maximum(sizes, 1.0)     # a temporary of this call
    return _efficiency(hw, "compute_curve", sizes, hw.compute_efficiency)


def _efficiency(hw, curve: str, sizes, fallback):
    """A device curve at `sizes` (>= 1, a temporary of the caller's it may overwrite): in place where it is a
    float64 array and the device has the curve object (hwmodels curves' of_scratch; the same numbers), else
    `fallback(sizes)`."""
    of_scratch = getattr(getattr(hw, curve, None), "of_scratch", None)
    if of_scratch is None or not (isinstance(sizes, np.ndarray) and sizes.dtype == np.float64):
        return fallback(sizes)
    return of_scratch(sizes)


def stream_flops(hw) -> float:
    """FLOP/s of the streaming kernel a GEMM-class op may run as instead of a tiled GEMM: the device's
    fp32 (non-matrix) peak at its compute plateau (the efficiency of an arbitrarily large kernel). 0.0
    (no such alternative) on devices with a measured skinny-GEMM table (gemm_rows_efficiency)."""
    if hw.tables.gemm_rows_curve is not None:
        return 0.0
    peak = float(hw.peak_flops(STREAM_DTYPE))
    plateau = float(np.asarray(compute_efficiency(hw, np.array([1e30]), peak)).ravel()[0])
    return peak * plateau


def gemm_rows_limit(hw, ops, eff):
    """Cap the compute efficiency of weight GEMMs at the device's skinny-GEMM fraction for their
    token-row count (hwmodels CalibratedTables.gemm_rows_efficiency; devices without that table:
    unchanged).

    `eff` is (n_ops, *shape); an op's rows may be scalar or broadcast to the trailing shape."""
    if hw.tables.gemm_rows_curve is None:
        return eff
    rows_eff = hw.tables.gemm_rows_efficiency
    eff = np.array(eff, dtype=float, copy=True)
    for i, op in enumerate(ops):
        if op.gemm and op.rows is not None:
            limit = rows_eff(np.maximum(np.asarray(op.rows, dtype=float), 1.0), op.weights_in_out)
            eff[i] = np.minimum(eff[i], limit)
    return eff


def _own_rates(ops, t_compute, flops, peak):
    """An engine profile's kernel rates (Profile.adjust_ops): Op.compute_eff replaces the op's compute
    efficiency (a fraction of its peak, whatever kernel the device would pick; NaN at a point: the
    device's own rate there), Op.compute_scale multiplies it (slower compute: the time is divided by the
    scale)."""
    if not any(op.compute_eff is not None or op.compute_scale is not None for op in ops):
        return t_compute
    t_compute = np.array(t_compute, dtype=float, copy=True)
    peak = np.broadcast_to(peak, t_compute.shape)
    for i, op in enumerate(ops):
        if op.compute_eff is not None:
            own = np.asarray(op.compute_eff, dtype=float)
            if np.isnan(own).any():     # points that keep the device's rate (e.g. a kernel mix by KV dtype)
                t_compute[i] = np.where(np.isnan(own), t_compute[i], flops[i] / (peak[i] * np.nan_to_num(own, nan=1.0)))
            else:
                t_compute[i] = flops[i] / (peak[i] * op.compute_eff)
        if op.compute_scale is not None:
            t_compute[i] = t_compute[i] / op.compute_scale
    return t_compute


def kernel_hosts(ops) -> list | None:
    """Per op, the index of the op whose kernel it runs in (itself when not fused); None when no op of
    the list is fused. A fused op's host is the nearest earlier op of the named kind."""
    if not any(op.fused_into for op in ops):
        return None
    last, hosts = {}, []
    for i, op in enumerate(ops):
        host = i
        if op.fused_into:
            host = last.get(op.fused_into)
            if host is None:
                raise ValueError(f"op {op.name} runs inside {op.fused_into}, which no earlier op is")
            if ops[host].per_layer != op.per_layer:
                raise ValueError(f"op {op.name} and its kernel {op.fused_into} must both be per layer or not")
        last[op.name] = i
        hosts.append(host)
    return hosts


def kernels_of(hosts):
    """{host index: [fused op indices]} for the kernels that have ops inside them."""
    kernels = {}
    for i, h in enumerate(hosts):
        if h != i:
            kernels.setdefault(h, []).append(i)
    return kernels


def op_costs(s, ops, flops, nbytes, factors=None, hosts=None):
    """Compute, memory and kernel seconds per op occurrence, each (n_ops, *shape), launches excluded,
    and the launches per op; fused ops' compute and memory seconds are moved to their kernel's row (so
    sums over ops are unchanged) and their kernel seconds are 0.

    `s` is a sim.engine.setup.Setup (peaks may be per-point arrays); `flops` and `nbytes` are per occurrence;
    `factors` the per-op streaming factors (sim.engine.timing.stream_factors, None when all 1); `hosts`
    kernel_hosts(ops), passed when the caller has it."""
    hw, n_ops = s.hw, len(ops)
    extra = (1,) * (np.ndim(flops) - 1)
    gemm = np.array([op.gemm for op in ops]).reshape(-1, *extra)
    peak = np.where(gemm, s.peak_gemm, s.peak_vector)     # peaks may be per-point arrays (mixed dtypes)
    peak = np.broadcast_to(peak, (n_ops,) + np.shape(peak)[1:])
    t_compute = flops / peak                                # no ramp: every op that is not a GEMM
    rows = [i for i, op in enumerate(ops) if op.gemm or op.matmul]
    if rows:                                                # GEMM-class: tiled (ramp) or streaming kernel
        f, p = flops[rows], peak[rows]
        eff = gemm_rows_limit(hw, [ops[i] for i in rows], compute_efficiency(hw, np.maximum(f, 1.0), p))
        tiled = np.divide(f, np.multiply(p, eff, out=eff if eff.shape == np.broadcast_shapes(p.shape, eff.shape)
                                         and eff.dtype == np.float64 else None))
        if s.stream_flops > 0:
            np.minimum(tiled, f / s.stream_flops, out=tiled)
        t_compute[rows] = tiled
    t_compute = _own_rates(ops, t_compute, flops, peak)
    if hosts is None:
        hosts = kernel_hosts(ops)
    kernels = kernels_of(hosts) if hosts is not None else {}
    if kernels:                     # a kernel streams all its ops' bytes: one size on the curve
        sizes = np.array(nbytes, dtype=float, copy=True)
        for h, inside in kernels.items():
            sizes[[h] + inside] = nbytes[h] + sum(nbytes[i] for i in inside)
        sizes = np.maximum(sizes, 1.0, out=sizes)
    else:
        sizes = np.maximum(nbytes, 1.0)
    b_eff = _efficiency(hw, "bw_curve", sizes, hw.bw_efficiency)
    if factors is not None:
        b_eff = b_eff * factors
    t_memory = nbytes / (hw.memory_bw * b_eff)
    for h, inside in kernels.items():
        for i in inside:
            t_compute[h] += t_compute[i]
            t_memory[h] += t_memory[i]
        t_compute[inside] = 0.0
        t_memory[inside] = 0.0
    counts = [op.launches for op in ops]
    if all(isinstance(c, (int, float)) for c in counts) or all(np.ndim(c) == 0 for c in counts):
        launches = np.array(counts, dtype=float).reshape(-1, *extra)
    else:   # per-point launch counts (an op that only some dtypes of a mixed grid run)
        launches = np.stack([np.broadcast_to(np.asarray(c, dtype=float), np.shape(flops)[1:]) for c in counts])
    return t_compute, t_memory, np.maximum(t_compute, t_memory), launches
