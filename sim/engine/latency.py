"""Request-level latency over many points: TTFT, TPOT (the mean over the decode steps, by quadrature over
a few nodes when the KV length varies) and end-to-end time, one pass over the operator tables per phase.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from sim import kvlen, policies
from sim.engine.setup import Setup, make_ctx
from sim.engine.timing import StepTotals, TimedOps, table_totals, time_ops, time_tables
from sim.op import FIELDS
from sim.ops import forward_ops

DECODE_NODES = 9                # quadrature nodes over the decode steps when the KV length varies


def decode_nodes(policy: str, gen, kv_override=None):
    """Decode steps to evaluate and their weights for the mean over T = gen - 1 steps.

    Evicting policies hold a constant length (one node). Full attention grows linearly: trapezoid
    over DECODE_NODES evenly spaced steps plus the Euler-Maclaurin end correction, which matches the
    exact per-step sum within 0.5% (tests/sim/test_engine.py checks it)."""
    steps = np.maximum(np.asarray(gen, float) - 1.0, 0.0)[..., None]          # T, shape (P, 1)
    if kv_override is not None:
        t = int(steps.max())
        idx = np.arange(max(t, 1), dtype=float)[None, :]
        return idx, np.full((1, idx.shape[1]), 1.0 / max(t, 1))
    m = 1 if policies.get(policy).evicts else DECODE_NODES
    if m == 1:
        return np.zeros_like(steps), np.ones_like(steps)
    j = np.arange(m, dtype=float)[None, :]
    last = np.maximum(steps - 1.0, 0.0)
    s = last * j / (m - 1)
    h = last / (m - 1)
    w = np.where((j == 0) | (j == m - 1), h / 2 + 0.5, h)
    return s, w / np.maximum(steps, 1.0)


def check_override(kv_override, gen: int, n_layers: int) -> np.ndarray:
    arr = np.asarray(kv_override, dtype=float)
    t = max(int(gen) - 1, 1)
    if arr.ndim != 2 or arr.shape[1] != n_layers or arr.shape[0] < t:
        raise ValueError(f"kv_override must have shape (gen+1, n_layers) = ({gen + 1}, {n_layers}), got {arr.shape}")
    if not np.all(np.isfinite(arr)) or (arr < 0).any():
        raise ValueError("kv_override must hold finite, non-negative token counts")
    return arr[:t]


def drop_layer_axis(t: TimedOps) -> TimedOps:
    """(ops, P, nodes, 1) -> (ops, P, nodes) when all layers are alike."""
    if t.time.ndim != 4:
        return t
    return TimedOps(t.names, {f: v[..., 0] for f, v in t.fields.items()}, t.t_compute[..., 0], t.t_memory[..., 0],
                    t.time[..., 0], t.step_time[..., 0], t.inside)


def drop_total_layer_axis(t: StepTotals) -> StepTotals:
    """(P, nodes, 1) -> (P, nodes): drop_layer_axis of the sums."""
    if t.step_time.ndim != 3:
        return t
    return StepTotals(t.step_time[..., 0], t.t_compute[..., 0], t.t_memory[..., 0],
                      {f: v[..., 0] for f, v in t.fields.items()})


def latency(s: Setup, batch, beams, prompt, gen, cache_ratio, recent_ratio, kv_override=None, keep_ops=False,
             parts=("prefill", "decode"), decode_batch=None, detail=None):
    """ttft, tpot (mean over gen-1 decode steps), e2e, plus decode diagnostics; arrays of shape (P,).
    `parts` may skip the prefill or the decode (its outputs are then 0); `decode_batch` (default `batch`)
    is the batch the decode runs at; `detail` (default: all) the leading points whose decode diagnostics
    (memory and compute seconds, KV bytes read, bound) are returned, shape (detail,)."""
    col = lambda a: np.asarray(a, float)[:, None, None]                      # (P, 1, 1)
    b, k, n, p, r = col(batch), col(beams), col(prompt), col(cache_ratio), col(recent_ratio)
    bd = b if decode_batch is None else col(decode_batch)
    per_point = {f: col(getattr(s, f)) for f in ("wb", "kvb", "ab", "peak_gemm", "peak_vector")
                 if np.ndim(getattr(s, f))}
    if per_point:                                                            # mixed dtypes: widths per point
        s = replace(s, **per_point)
    keep = FIELDS if keep_ops else ("kv_read_bytes",)
    zeros = np.zeros(np.shape(b)[0])
    pre_ops = forward_ops(make_ctx(s, "prefill", b, k, n, 0.0, p, r)) if "prefill" in parts else None
    if "decode" not in parts:
        ttft = zeros if pre_ops is None else drop_layer_axis(time_ops(s, pre_ops, keep=keep)).step_time[:, 0]
        return dict(ttft_s=ttft, tpot_s=zeros, e2e_s=ttft)
    lean = "prefill" not in parts and not keep_ops       # capacity's decode-only pass: TPOT alone
    nodes, weights = decode_nodes(s.policy, gen, kv_override)                # (P or 1, nodes)
    if kv_override is None:
        past, slots = kvlen.kv_tokens(s.policy, n[..., 0], nodes, p[..., 0], model=s.model)[..., None], 1
    else:
        past, slots = np.asarray(kv_override, float)[None, :, :], s.model.n_layers
    dec_ops = forward_ops(make_ctx(s, "decode", bd, k, 1.0, past, p, r))
    sums_of = None                                        # diagnostics of every point
    if pre_ops is not None and slots == 1 and keep_ops:  # both phases in one pass where their shapes agree
        pre, dec = (drop_layer_axis(t) for t in time_tables(s, [pre_ops, dec_ops], keep=keep))
    elif pre_ops is not None and slots == 1:             # only the sums are read: no per-op tables
        # (not for a single point at one node: numpy sums a table whose other axes are all 1 pairwise, not
        # row after row as it sums the stacked table, and the last bit would differ)
        sums_of = detail if detail is not None and detail < np.shape(b)[0] and detail * np.shape(nodes)[-1] > 1 else None
        pre, dec = (drop_total_layer_axis(t) for t in table_totals(s, [pre_ops, dec_ops], keep=keep, detail=sums_of))
    else:
        pre = None if pre_ops is None else drop_layer_axis(time_ops(s, pre_ops, keep=keep))
        dec = drop_layer_axis(time_ops(s, dec_ops, layer_slots=slots, keep=keep))
    ttft = zeros if pre is None else pre.step_time[:, 0]
    t_steps = np.maximum(np.asarray(gen, float) - 1.0, 0.0)
    mean = lambda a: (a * weights).sum(-1)                                   # over decode-step nodes
    tpot = np.where(t_steps > 0, mean(dec.step_time), 0.0)
    if lean:
        return dict(ttft_s=ttft, tpot_s=tpot, e2e_s=ttft + t_steps * tpot)
    totals = dec.totals() if isinstance(dec, TimedOps) else dec
    if sums_of is not None and np.shape(weights)[0] > 1:  # the leading points' only
        weights = weights[:sums_of]
    tm, tc = mean(totals.t_memory), mean(totals.t_compute)
    out = dict(ttft_s=ttft, tpot_s=tpot, e2e_s=ttft + t_steps * tpot,
               decode_memory_time_s=tm, decode_compute_time_s=tc,
               decode_kv_read_bytes=mean(totals.fields["kv_read_bytes"]),
               decode_bound=np.where(tm >= tc, "memory", "compute"))
    if keep_ops:
        out.update(_prefill=pre, _decode=dec, _weights=weights)
    return out




def stacked_latency(s: Setup, prefill_batches, decode_batches, beams, prompt, gen, cache_ratio, recent_ratio,
                     kv_override, keep_ops) -> dict:
    """latency for the points repeated once per entry of `prefill_batches` (each of the points' shape),
    prefilling at those batches and decoding at the matching `decode_batches`: one pass over the
    operator tables, so their per-call cost is paid once (sweeps evaluate many small groups)."""
    k = len(prefill_batches)
    tile = (lambda a: np.concatenate([np.asarray(a, float)] * k) if np.ndim(a) else a) if k > 1 else (lambda a: a)
    per_point = {f: tile(getattr(s, f)) for f in ("wb", "kvb", "ab", "peak_gemm", "peak_vector")
                 if np.ndim(getattr(s, f))}
    stacked = replace(s, **per_point) if per_point and k > 1 else s
    join = (lambda arrays: np.concatenate([np.asarray(a, float) for a in arrays])) if k > 1 else (lambda a: a[0])
    # the stacked capacity batches are read for their TTFT and TPOT only: decode diagnostics (memory and
    # compute seconds, KV bytes) are summed for the points at their own batch, the leading entry
    return latency(stacked, join(prefill_batches), tile(beams), tile(prompt), tile(gen), tile(cache_ratio),
                    tile(recent_ratio), kv_override, keep_ops=keep_ops, decode_batch=join(decode_batches),
                    detail=np.shape(prefill_batches[0])[0] if k > 1 else None)


