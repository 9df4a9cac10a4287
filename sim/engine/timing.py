"""Timing a list of operators: the roofline of sim.opcost plus launches, per op (`time_ops`, arrays over
points, decode steps and layers) or summed to one step (`step_time_scalar`, the DES hot path). Both go
through `kernel_seconds`, the one formula; they differ only in how they gather the ops' numbers.
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass

import numpy as np

from sim.engine.scalar import scalar_step_seconds
from sim.engine.setup import Setup
from sim.op import BYTE_FIELDS, FIELDS, Op
from sim.opcost import kernel_hosts, kernels_of, op_costs


def streams_weights(op: Op) -> bool:
    """A GEMM over the model's weights (each of its launches streams one weight matrix)."""
    return op.gemm and bool(np.any(np.asarray(op.weight_bytes) > 0))




def stack(values) -> np.ndarray:
    """(n_ops, *broadcast shape) float array from scalars and/or arrays."""
    shapes = {v.shape for v in values if isinstance(v, np.ndarray)}
    if not shapes and all(isinstance(v, (int, float)) for v in values):
        return np.array(values, dtype=float)
    shape = shapes.pop() if len(shapes) == 1 else np.broadcast_shapes(*shapes, *(np.shape(v) for v in values))
    out = np.empty((len(values), *shape))
    for i, v in enumerate(values):
        out[i] = v                                  # broadcasting assignment: no temporaries
    return out


@dataclass
class TimedOps:
    """Per-op arrays (n_ops, *shape): totals over the layers of one step, and the step time."""
    names: list
    fields: dict          # FIELDS -> (n_ops, *shape), summed over layers
    t_compute: np.ndarray
    t_memory: np.ndarray
    time: np.ndarray      # per op, including launch overhead
    step_time: np.ndarray  # (*shape): sum over ops + host overhead
    # per op, the op whose kernel it runs inside (Op.fused_into; its seconds are on that op's row), or None
    inside: list | None = None

    def totals(self) -> StepTotals:
        return StepTotals(self.step_time, self.t_compute.sum(0), self.t_memory.sum(0),
                          {f: v.sum(0) for f, v in self.fields.items()})


@dataclass
class StepTotals:
    """A step's sums over its ops (*shape), what a request-level answer reads: the step time (host
    overhead included), compute and memory seconds, and the kept FLOP/byte columns."""
    step_time: np.ndarray
    t_compute: np.ndarray
    t_memory: np.ndarray
    fields: dict


def stream_factors(s: Setup, ops) -> list | None:
    """Per op, the factor its streaming efficiency is multiplied by: the attention tables' factor for
    Op.kv_stream, times the fresh-allocation factor at Op.fresh_tensor_bytes (scalars or arrays; 1.0 for
    the rest), or None when every factor is 1 (devices without those tables: nothing to do). Factors
    are in (0, 1], so they only slow ops down: the bytes / bandwidth floor still holds."""
    attention = not (s.attn_scores_factor == 1.0 and s.attn_values_factor == 1.0)
    fresh = s.hw.tables.fresh_alloc_curve is not None and any(
        op.fresh_tensor_bytes is not None for op in ops)
    own = any(op.bw_scale is not None for op in ops)
    if not attention and not fresh and not own:
        return None
    by_kind = {"scores": s.attn_scores_factor, "values": s.attn_values_factor}
    factors = []
    for op in ops:
        factor = by_kind.get(op.kv_stream, 1.0)
        if fresh and op.fresh_tensor_bytes is not None:
            factor = factor * s.hw.tables.fresh_alloc_factor(np.maximum(op.fresh_tensor_bytes, 1.0))
        if op.bw_scale is not None:
            factor = factor * op.bw_scale
        factors.append(factor)
    return factors


def launch_costs(s: Setup, ops) -> list | None:
    """Per op, seconds per launch: launch_s, plus switch_s for GEMMs over weights (eager profiles on
    devices with eager_weight_switch_s); None when that is launch_s for every op."""
    if not s.switch_s:
        return None
    return [s.launch_s + s.switch_s * streams_weights(op) for op in ops]


def kernel_seconds(s: Setup, ops: list[Op], flops, nbytes, extra=()):
    """The one formula of an operator's time, per occurrence (arrays (n_ops, *shape)): its kernel's roofline
    seconds (sim.opcost.op_costs: compute vs bytes at the streaming rate, times the ops' stream factors)
    plus its launches times the seconds per launch; also its compute and memory seconds. `extra` is the
    trailing shape of ones that per-op columns broadcast with (() for 1-D scalar ops)."""
    factors = stream_factors(s, ops)
    if factors is not None:
        stacked = stack(factors)
        factors = stacked.reshape(-1, *extra) if stacked.ndim == 1 else stacked
    t_compute, t_memory, t_kernel, launches = op_costs(s, ops, flops, nbytes, factors)
    costs = launch_costs(s, ops)
    per_launch = s.launch_s if costs is None else np.array(costs).reshape(-1, *extra)
    return t_compute, t_memory, t_kernel + launches * per_launch


# the Op fields that may hold per-point arrays: an op's own shape is their broadcast
ARRAY_FIELDS = FIELDS + ("launches", "rows", "compute_eff", "compute_scale", "bw_scale", "fresh_tensor_bytes")


_array_fields = operator.attrgetter(*ARRAY_FIELDS)


def op_shape(op: Op) -> tuple:
    shape = None
    for v in _array_fields(op):
        if isinstance(v, np.ndarray) and v.shape != shape:
            shape = v.shape if shape is None else np.broadcast_shapes(shape, v.shape)
    return () if shape is None else shape


def op_shapes(ops: list[Op]) -> list[tuple]:
    return [op_shape(op) for op in ops]


def node_partition(ops: list[Op], shapes: list[tuple] | None = None) -> list[int] | None:
    """Indices of the ops smaller than the table (e.g. a full-attention decode's dense ops, the same at every
    decode-step node while attention grows), with every fused kernel kept whole; None when all ops share
    the table's shape (nothing to save). Every formula is elementwise per op, so timing those ops at their
    own shape and broadcasting the seconds gives the same numbers in a fraction of the work."""
    shapes = op_shapes(ops) if shapes is None else shapes
    distinct = set(shapes)
    if len(distinct) == 1:
        return None
    full = math.prod(np.broadcast_shapes(*distinct))
    small = [math.prod(shape) < full for shape in shapes]
    if all(small):
        return None
    hosts = kernel_hosts(ops)
    for host, inside in (kernels_of(hosts) if hosts is not None else {}).items():
        kernel = [host, *inside]           # a kernel with any large op is large, host and inside alike
        if not all(small[i] for i in kernel):
            for i in kernel:
                small[i] = False
    picked = [i for i, is_small in enumerate(small) if is_small]
    if not picked or math.prod(np.broadcast_shapes(*{shapes[i] for i in picked})) >= full:
        return None
    return picked


def op_bytes(op: Op):
    """An op's bytes, its BYTE_FIELDS added in that order at the op's own shape (scalars stay scalars):
    the same sum, element for element, as adding the table's byte columns."""
    total = np.add(op.weight_bytes, op.act_bytes, dtype=float)
    return np.add(np.add(total, op.kv_read_bytes, dtype=float), op.kv_write_bytes, dtype=float)


def _timed_part(s: Setup, ops: list[Op], layer_slots: int, keep, ndim: int | None = None, detail: int | None = None):
    """(per_op, t_compute, t_memory, fields) of `ops`, per op and layer slot times its occurrences; with
    `detail`, t_compute, t_memory and fields only for the table's leading `detail` points (axis 1), the
    only ones a caller reads them for (a sweep's capacity batches, stacked behind the points, need
    step times alone): the same numbers there, a fraction of the work."""
    n_layers = s.model.n_layers
    columns = {"flops": stack([op.flops for op in ops]), "bytes": stack([op_bytes(op) for op in ops])}
    columns |= {f: stack([getattr(op, f) for op in ops]) for f in keep if f != "flops"}
    # every column as (n_ops, *table axes): a column of scalars is (n_ops,) and must not broadcast along
    # the last axis; a part of a larger table (`ndim`) gets that table's axes, as ones where it has none
    ndim = max([ndim or 0] + [v.ndim - 1 for v in columns.values()])
    columns = {f: v.reshape(v.shape[:1] + (1,) * (ndim + 1 - v.ndim) + v.shape[1:]) for f, v in columns.items()}
    flops, nbytes = np.broadcast_arrays(columns["flops"], columns["bytes"])
    extra = (1,) * (flops.ndim - 1)
    # occurrences per layer slot: per-layer ops run n_layers times in all; the others once per step
    mult = np.array([n_layers / layer_slots if op.per_layer else 1.0 / layer_slots for op in ops]).reshape(-1, *extra)
    t_compute, t_memory, per_occurrence = kernel_seconds(s, ops, flops, nbytes, extra)
    fields = {f: np.broadcast_to(columns[f], flops.shape) for f in keep}
    if detail is not None and flops.ndim > 1:
        cut = (slice(None), slice(0, detail))
        t_compute, t_memory = t_compute[cut], t_memory[cut]
        fields = {f: v[cut] for f, v in fields.items()}
    return per_occurrence * mult, t_compute * mult, t_memory * mult, {f: v * mult for f, v in fields.items()}


def time_ops(s: Setup, ops: list[Op], layer_slots: int = 1, keep=FIELDS, shapes=None, detail=None) -> TimedOps:
    """Roofline time per operator; the trailing axis is the layer-slot axis when `layer_slots` > 1.

    `keep` names the FLOP/byte columns to return (sweeps skip the ones no output needs). Ops smaller
    than the table (node_partition) are timed at their own shape and broadcast into it. `detail`: see
    _timed_part."""
    shapes = op_shapes(ops) if shapes is None else shapes
    small = node_partition(ops, shapes)
    if small is None:
        per_op, t_compute, t_memory, fields = _timed_part(s, ops, layer_slots, keep, detail=detail)
    else:
        chosen = set(small)
        large = [i for i in range(len(ops)) if i not in chosen]
        ndim = len(np.broadcast_shapes(*(shapes[i] for i in large)))
        big = _timed_part(s, [ops[i] for i in large], layer_slots, keep, detail=detail)
        little = _timed_part(s, [ops[i] for i in small], layer_slots, keep, ndim, detail)

        def merged(a, b):
            out = np.empty((len(ops),) + np.broadcast_shapes(a.shape[1:], b.shape[1:]))
            out[large], out[small] = a, b
            return out

        per_op, t_compute, t_memory = (merged(a, b) for a, b in zip(big[:3], little[:3]))
        fields = {f: merged(big[3][f], little[3][f]) for f in keep}
    if layer_slots > 1:   # collapse the layer axis: totals over the step
        per_op, t_compute, t_memory = per_op.sum(-1), t_compute.sum(-1), t_memory.sum(-1)
        fields = {f: v.sum(-1) for f, v in fields.items()}
    return _timed_ops(s, ops, per_op, t_compute, t_memory, fields)


def step_totals(s: Setup, ops: list[Op], keep=FIELDS, shapes=None, detail=None) -> StepTotals:
    """time_ops(s, ops, keep=keep).totals() (one layer slot) without the per-op tables: where ops smaller
    than the table are timed at their own shape (node_partition), their rows are added into the sums
    as they are, in op order, instead of first being broadcast into a full table. The same numbers: a sum
    over axis 0 adds row after row in that order too."""
    shapes = op_shapes(ops) if shapes is None else shapes
    small = node_partition(ops, shapes)
    if small is None:
        return time_ops(s, ops, keep=keep, shapes=shapes, detail=detail).totals()
    chosen = set(small)
    large = [i for i in range(len(ops)) if i not in chosen]
    ndim = len(np.broadcast_shapes(*(shapes[i] for i in large)))
    big = _timed_part(s, [ops[i] for i in large], 1, keep, detail=detail)
    little = _timed_part(s, [ops[i] for i in small], 1, keep, ndim, detail)
    row = {i: (big, j) for j, i in enumerate(large)} | {i: (little, j) for j, i in enumerate(small)}

    def ordered_sum(pick):
        full = np.broadcast_shapes(pick(big).shape[1:], pick(little).shape[1:])
        part, j = row[0]
        total = np.array(np.broadcast_to(pick(part)[j], full))
        for i in range(1, len(ops)):
            part, j = row[i]
            total += pick(part)[j]
        return total

    per_op, t_compute, t_memory = (ordered_sum(lambda part, k=k: part[k]) for k in range(3))
    fields = {f: ordered_sum(lambda part, f=f: part[3][f]) for f in keep}
    return StepTotals(per_op + s.host_s, t_compute, t_memory, fields)


def _timed_ops(s: Setup, ops: list[Op], per_op, t_compute, t_memory, fields) -> TimedOps:
    return TimedOps([op.name for op in ops], fields, t_compute, t_memory, per_op, per_op.sum(0) + s.host_s,
                    [op.fused_into for op in ops])


def time_tables(s: Setup, tables: list[list[Op]], keep=FIELDS, shapes=None, detail=None) -> list[TimedOps]:
    """time_ops of each op list (one layer slot), in one pass over the operator tables when all their ops
    share a shape (a prefill and an evicting policy's decode: one roofline evaluation instead of two);
    the same numbers either way, since every formula is elementwise per op. `detail`: see _timed_part."""
    ops = [op for table in tables for op in table]
    shapes = op_shapes(ops) if shapes is None else shapes
    if len(set(shapes)) > 1:
        out, start = [], 0
        for table in tables:
            out.append(time_ops(s, table, keep=keep, shapes=shapes[start:start + len(table)], detail=detail))
            start += len(table)
        return out
    per_op, t_compute, t_memory, fields = _timed_part(s, ops, 1, keep, detail=detail)
    out, start = [], 0
    for table in tables:
        rows = slice(start, start + len(table))
        start = rows.stop
        out.append(_timed_ops(s, table, per_op[rows], t_compute[rows], t_memory[rows],
                              {f: v[rows] for f, v in fields.items()}))
    return out


def table_totals(s: Setup, tables: list[list[Op]], keep=FIELDS, detail=None) -> list[StepTotals]:
    """[t.totals() for t in time_tables(s, tables, keep, detail=detail)], without per-op tables where a
    table's ops differ in shape (step_totals)."""
    ops = [op for table in tables for op in table]
    shapes = op_shapes(ops)
    if len(set(shapes)) == 1:
        return [t.totals() for t in time_tables(s, tables, keep=keep, shapes=shapes, detail=detail)]
    out, start = [], 0
    for table in tables:
        out.append(step_totals(s, table, keep=keep, shapes=shapes[start:start + len(table)], detail=detail))
        start += len(table)
    return out


def step_time_scalar(s: Setup, ops: list[Op], host: bool = True) -> float:
    """time_ops(...).step_time for scalar ops by the same formula (kernel_seconds) on 1-D arrays: the DES
    hot path gathers a dozen ops' numbers without the broadcasting machinery; on Python floats where
    sim.engine.scalar covers the case (the same result bit for bit)."""
    fast = scalar_step_seconds(s, ops, host)
    return numpy_step_time(s, ops, host) if fast is None else fast


def numpy_step_time(s: Setup, ops: list[Op], host: bool = True) -> float:
    """step_time_scalar through kernel_seconds' numpy arrays (any device, any op fields)."""
    flops = np.array([float(op.flops) for op in ops])
    nbytes = np.array([float(op.weight_bytes + op.act_bytes + op.kv_read_bytes + op.kv_write_bytes) for op in ops])
    _tc, _tm, per_occurrence = kernel_seconds(s, ops, flops, nbytes)
    n_layers = s.model.n_layers
    total = float(np.dot(per_occurrence, [n_layers if op.per_layer else 1.0 for op in ops]))
    return total + (s.host_s if host else 0.0)
