"""The analytic roofline engine: operator tables -> step times -> request latency, memory and capacity.

Pure numpy. `evaluate(...)` takes arrays of design points (batch, beams, prompt, gen, cache ratio,
recent ratio, dtypes) for one (device, model, policy, profile) and returns arrays of results; `predict`
is that same path for one point plus the operator tables. Time per kernel (an operator plus those that
run inside it) is
    max(compute seconds, bytes / (bw * bw_eff(bytes))) + launches * launch_overhead
where only GEMM-class operators pay the compute-efficiency ramp (sim.opcost has the one rule; eager
profiles: launches * eager_call_overhead where the hardware file has it) and a step adds the device's
host overhead. docs/sim.md has the formulas and assumptions.

Array layout inside: (points, decode-step nodes, layer slots). Layer slots is 1 (all layers alike,
each op counted n_layers times) or n_layers (a trace's per-layer KV lengths via `kv_override`).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from hwmodels.device import NEUTRAL
from hwmodels.dtypes import canonical_dtype, dtype_bytes
from sim import capacity, kvlen, policies
from sim.models import ModelSpec, load_model
from sim.opcost import kernel_hosts, op_costs, stream_flops
from sim.ops import BYTE_FIELDS, FIELDS, Op, OpContext, dense_ops, forward_ops, group_ops
from sim.profiles import CORE_OPS, PROFILES, Profile, get_profile

DECODE_NODES = 9                # quadrature nodes over the decode steps when the KV length varies
MAX_BATCH_LIMIT = capacity.MAX_BATCH_LIMIT


# ----------------------------------------------------------------------------------------------------
# Resolving names once per (device, model, policy, dtypes, profile)

def resolve_device(hw):
    if isinstance(hw, str):
        try:
            from hwmodels import load_device
        except ImportError as exc:  # hwmodels not installed/complete: a setup problem, said in one line
            raise ValueError(f"cannot load hardware {hw!r}: hwmodels.load_device unavailable ({exc})") from None
        return load_device(hw)
    return hw


def activation_dtype(weight_dtype: str) -> str:
    """Activations stay in bf16 for 16-bit and quantised weights; fp32 weights run fp32 activations."""
    return "fp32" if weight_dtype == "fp32" else "bf16"


@dataclass(frozen=True)
class Setup:
    hw: Any
    model: ModelSpec
    policy: str
    weight_dtype: str
    kv_dtype: str
    act_dtype: str
    profile: Profile
    wb: float
    kvb: float
    ab: float
    peak_gemm: float
    peak_vector: float
    host_s: float
    # seconds charged per launch: the device's eager_call_overhead_s for eager profiles on devices
    # that have it, else launch_overhead_s (see launch_seconds)
    launch_s: float
    # seconds charged per weight-GEMM launch on top of launch_s: the device's eager_weight_switch_s for
    # eager profiles (the eager calls after a streamed weight run with cold caches), else 0
    switch_s: float
    # fractions of the streaming rate reached by the attention GEMVs over the KV cache at this
    # model's head width (Op.kv_stream); 1.0 on devices without the tables
    attn_scores_factor: float = 1.0
    attn_values_factor: float = 1.0
    # FLOP/s of the streaming kernel GEMM-class ops may run as instead of a tiled GEMM (sim.opcost.
    # stream_flops); 0.0: none (devices with a measured skinny-GEMM table)
    stream_flops: float = 0.0


_SETUP_CACHE: dict = {}


def make_setup(hw, model, policy="full", weight_dtype="bf16", kv_dtype="bf16", profile="fused") -> Setup:
    """Resolve names and dtypes once; cached, since the DES asks for the same setup every step."""
    ident = lambda o: o if isinstance(o, str) else id(o)
    key = (ident(hw), ident(model), policy, weight_dtype, kv_dtype, ident(profile))
    hit = _SETUP_CACHE.get(key)
    if (hit is not None and (isinstance(hw, str) or hit[1] is hw) and (isinstance(model, str) or hit[2] is model)
            and (not isinstance(profile, str) or PROFILES.get(profile) is hit[0].profile)):   # re-registered?
        return hit[0]
    hw_obj, model_obj = resolve_device(hw), load_model(model)
    wd, kd = canonical_dtype(weight_dtype), canonical_dtype(kv_dtype)
    ad = activation_dtype(wd)
    prof = get_profile(profile)
    setup = Setup(hw=hw_obj, model=model_obj, policy=kvlen.check_policy(policy), weight_dtype=wd, kv_dtype=kd,
                  act_dtype=ad, profile=prof, wb=dtype_bytes(wd), kvb=dtype_bytes(kd), ab=dtype_bytes(ad),
                  peak_gemm=float(hw_obj.peak_flops(wd)), peak_vector=float(hw_obj.peak_flops(ad)),
                  host_s=float(hw_obj.host_overhead_s if prof.host_overhead_s is None else prof.host_overhead_s)
                  + prof.extra_host_overhead_s,
                  launch_s=launch_seconds(hw_obj, prof), switch_s=switch_seconds(hw_obj, prof),
                  stream_flops=stream_flops(hw_obj), **_attn_factors(hw_obj, model_obj.head_dim))
    if len(_SETUP_CACHE) > 4096:
        _SETUP_CACHE.clear()
    _SETUP_CACHE[key] = (setup, hw, model)    # holding hw/model keeps their ids valid
    return setup


def launch_seconds(hw, profile: Profile) -> float:
    """Time per launch: an eager profile's launches are top-level calls of eager model code, which cost
    the device's calibrated eager_call_overhead_s (hwmodels.calibrate's eager_call benchmark) where
    the file has one; everything else pays launch_overhead_s (a bare dispatch / kernel launch)."""
    if profile.launch_overhead_s is not None:       # an engine profile's own (fitted) launch cost
        return float(profile.launch_overhead_s)
    eager_call = hw.tables.eager_call_overhead_s if profile.eager else None
    return hw.launch_overhead_s if eager_call is None else eager_call


def switch_seconds(hw, profile: Profile) -> float:
    """Extra time per weight-GEMM launch of an eager profile: on a CPU the stream of a weight evicts the
    dispatcher's code and data, and the eager calls that follow refill them (hwmodels.calibrate's
    eager_stream benchmark). Fused profiles and devices without the figure: 0."""
    switch = hw.tables.eager_weight_switch_s if profile.eager else None
    return 0.0 if switch is None else float(switch)


def streams_weights(op: Op) -> bool:
    """A GEMM over the model's weights (each of its launches streams one weight matrix)."""
    return op.gemm and bool(np.any(np.asarray(op.weight_bytes) > 0))


def _attn_factors(hw, head_dim) -> dict:
    """Setup fields of the KV-stream factors, looked up once per setup (step_time_scalar is a DES hot
    path); 1.0 (the cache streams like any op) on devices without the tables."""
    return {"attn_scores_factor": float(hw.tables.attn_scores_factor(head_dim)),
            "attn_values_factor": float(hw.tables.attn_values_factor(head_dim))}


def make_ctx(s: Setup, phase, batch, beams, new_tokens, past_tokens, cache_ratio=1.0, recent_ratio=0.3,
             completes_prompt=True) -> OpContext:
    return OpContext(model=s.model, policy=s.policy, phase=phase, batch=batch, beams=beams, rows=batch * beams,
                     new_tokens=new_tokens, past_tokens=past_tokens, cache_ratio=cache_ratio,
                     recent_ratio=recent_ratio, weight_dtype=s.weight_dtype, kv_dtype=s.kv_dtype,
                     act_dtype=s.act_dtype, wb=s.wb, kvb=s.kvb, ab=s.ab, profile=s.profile,
                     completes_prompt=completes_prompt, hw=s.hw)


# ----------------------------------------------------------------------------------------------------
# Timing a list of operators

def _stack(values) -> np.ndarray:
    """(n_ops, *broadcast shape) float array from scalars and/or arrays."""
    if all(isinstance(v, (int, float)) for v in values):
        return np.array(values, dtype=float)
    shape = np.broadcast_shapes(*(np.shape(v) for v in values))
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


def _stream_factors(s: Setup, ops) -> list | None:
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


def _launch_costs(s: Setup, ops) -> list | None:
    """Per op, seconds per launch: launch_s, plus switch_s for GEMMs over weights (eager profiles on
    devices with eager_weight_switch_s); None when that is launch_s for every op."""
    if not s.switch_s:
        return None
    return [s.launch_s + s.switch_s * streams_weights(op) for op in ops]


def time_ops(s: Setup, ops: list[Op], layer_slots: int = 1, keep=FIELDS) -> TimedOps:
    """Roofline time per operator; the trailing axis is the layer-slot axis when `layer_slots` > 1.

    `keep` names the FLOP/byte columns to return (sweeps skip the ones no output needs)."""
    n_layers = s.model.n_layers
    flops = _stack([op.flops for op in ops])
    byte_parts = {f: _stack([getattr(op, f) for op in ops]) for f in BYTE_FIELDS}
    nbytes = sum(byte_parts[f] for f in BYTE_FIELDS)
    flops, nbytes = np.broadcast_arrays(flops, nbytes)
    extra = (1,) * (flops.ndim - 1)
    # occurrences per layer slot: per-layer ops run n_layers times in all; the others once per step
    mult = np.array([n_layers / layer_slots if op.per_layer else 1.0 / layer_slots for op in ops]).reshape(-1, *extra)
    factors = _stream_factors(s, ops)
    if factors is not None:
        stacked = _stack(factors)
        factors = stacked.reshape(-1, *extra) if stacked.ndim == 1 else stacked
    t_compute, t_memory, t_kernel, launches = op_costs(s, ops, flops, nbytes, factors)
    costs = _launch_costs(s, ops)
    per_launch = s.launch_s if costs is None else np.array(costs).reshape(-1, *extra)
    per_op = (t_kernel + launches * per_launch) * mult
    parts = {"flops": flops, **byte_parts}
    fields = {f: np.broadcast_to(parts[f], flops.shape) * mult for f in keep}
    t_compute, t_memory = t_compute * mult, t_memory * mult
    if layer_slots > 1:   # collapse the layer axis: totals over the step
        per_op, t_compute, t_memory = per_op.sum(-1), t_compute.sum(-1), t_memory.sum(-1)
        fields = {f: v.sum(-1) for f, v in fields.items()}
    return TimedOps([op.name for op in ops], fields, t_compute, t_memory, per_op, per_op.sum(0) + s.host_s,
                    [op.fused_into for op in ops])


def step_time_scalar(s: Setup, ops: list[Op], host: bool = True) -> float:
    """time_ops(...).step_time for scalar ops, by the same rule (sim.opcost.op_costs) on 1-D arrays
    (the DES hot path: one numpy pass over a dozen ops instead of the broadcasting machinery)."""
    flops = np.array([float(op.flops) for op in ops])
    nbytes = np.array([float(op.weight_bytes + op.act_bytes + op.kv_read_bytes + op.kv_write_bytes) for op in ops])
    factors = _stream_factors(s, ops)
    if factors is not None:
        factors = np.array([float(f) for f in factors])
    _tc, _tm, t_kernel, launches = op_costs(s, ops, flops, nbytes, factors)
    costs = _launch_costs(s, ops)
    n_layers = s.model.n_layers
    mult = [n_layers if op.per_layer else 1.0 for op in ops]
    total = float(np.dot(t_kernel + launches * (s.launch_s if costs is None else np.array(costs)), mult))
    return total + (s.host_s if host else 0.0)


_DENSE_MEMO: dict = {}


def _dense_time(s: Setup, rows: float, beams: float, tokens_per_row: float) -> float:
    """Dense-op time depends only on the token and row counts, which repeat step after step in a DES."""
    key = (id(s), rows, beams, tokens_per_row)
    hit = _DENSE_MEMO.get(key)
    if hit is None or hit[1] is not s:
        if len(_DENSE_MEMO) > 65536:
            _DENSE_MEMO.clear()
        hit = _DENSE_MEMO[key] = (step_time_scalar(s, dense_ops(make_ctx(s, "prefill", rows / beams, beams,
                                                                                 tokens_per_row, 0.0)), host=False), s)
    return hit[0]


# ----------------------------------------------------------------------------------------------------
# Step-level entries used by the DES (scalars in, float out; keep them cheap)

def decode_step_time(hw, model, kv_tokens, *, weight_dtype="bf16", kv_dtype="bf16", policy="full",
                     profile="fused", beams=1, recent_ratio=0.3) -> float:
    """One decode step for a batch whose request i holds kv_tokens[i] cached tokens per KV head
    (mean over layers). Attention cost follows the total kept tokens (one batched kernel)."""
    s = make_setup(hw, model, policy, weight_dtype, kv_dtype, profile)
    kv = kv_tokens if isinstance(kv_tokens, np.ndarray) else np.asarray(kv_tokens, dtype=float)
    if kv.size == 0:
        return 0.0
    beams = float(beams)
    ctx = make_ctx(s, "decode", float(kv.size), beams, 1.0, float(kv.mean()), recent_ratio=float(recent_ratio))
    return _dense_time(s, ctx.rows, beams, 1.0) + step_time_scalar(s, group_ops(ctx))


def _chunk_groups(s: Setup, chunks, beams, cache_ratio, recent_ratio):
    groups = []
    for chunk in chunks:
        if len(chunk) not in (2, 3):
            raise ValueError(f"prefill chunk must be (new_tokens, past_tokens[, completes_prompt]), got {chunk!r}")
        new, past = float(chunk[0]), float(chunk[1])
        if new <= 0 or past < 0:
            raise ValueError(f"prefill chunk needs new_tokens > 0 and past_tokens >= 0, got {chunk!r}")
        completes = bool(chunk[2]) if len(chunk) == 3 else True
        groups.append(make_ctx(s, "prefill", 1.0, float(beams), new, past, cache_ratio, recent_ratio, completes))
    return groups


def mixed_step_time(hw, model, decode_kv_tokens, chunks, *, weight_dtype="bf16", kv_dtype="bf16",
                    policy="full", profile="fused", beams=1, cache_ratio=1.0, recent_ratio=0.3) -> float:
    """One step running decodes (request i holds decode_kv_tokens[i] tokens) and prefill chunks
    `(new_tokens, past_tokens[, completes_prompt])` together: the dense layers see all tokens at once,
    attention and policy ops run per group. A chunk completing its prompt (default) pays the policy's
    selection and compaction."""
    s = make_setup(hw, model, policy, weight_dtype, kv_dtype, profile)
    kv = np.asarray(decode_kv_tokens if decode_kv_tokens is not None else [], dtype=float).ravel()
    groups = _chunk_groups(s, chunks, beams, cache_ratio, recent_ratio)
    if kv.size:
        groups.append(make_ctx(s, "decode", float(kv.size), float(beams), 1.0, float(kv.mean()),
                               recent_ratio=float(recent_ratio)))
    if not groups:
        return 0.0
    # dense ops depend on rows * new_tokens (tokens through the weights) and rows (logit rows)
    tokens = sum(g.rows * g.new_tokens for g in groups)
    logit_rows = sum(g.rows for g in groups)
    dense = _dense_time(s, logit_rows, float(beams), tokens / logit_rows)
    return dense + step_time_scalar(s, [op for g in groups for op in group_ops(g)])


def prefill_time(hw, model, chunks, *, weight_dtype="bf16", kv_dtype="bf16", policy="full", profile="fused",
                 beams=1, cache_ratio=1.0, recent_ratio=0.3) -> float:
    """Prefill of chunks `(new_tokens, past_tokens[, completes_prompt])` in one step."""
    return mixed_step_time(hw, model, None, chunks, weight_dtype=weight_dtype, kv_dtype=kv_dtype, policy=policy,
                           profile=profile, beams=beams, cache_ratio=cache_ratio, recent_ratio=recent_ratio)


# ----------------------------------------------------------------------------------------------------
# Memory and capacity

def memory_bytes(model, batch, kv_tokens, *, prompt, beams=1, kv_dtype="bf16", weight_dtype="bf16",
                 policy="full", profile="fused", hw=None):
    """Peak device memory: weights + KV (rows x kv_tokens) + score state + prefill workspace + logits
    (+ the profile's own buffers). `kv_tokens` is the most tokens a KV head holds at once
    (sim.kvlen.peak_kv_tokens). `hw` only matters to profiles whose buffers depend on the device."""
    s = make_setup(hw if hw is not None else _NO_DEVICE, model, policy, weight_dtype, kv_dtype, profile)
    rows = np.asarray(batch, float) * np.asarray(beams, float)
    return capacity.memory(s, rows, np.asarray(kv_tokens, float), np.asarray(prompt, float))


def max_batch(hw, model, prompt, gen, *, policy="full", cache_ratio=1.0, beams=1, kv_dtype="bf16",
              weight_dtype="bf16", profile="fused", kv_peak_tokens=None):
    """Largest batch (requests) in the steady state of continuous batching: only the requests being
    prefilled hold their whole prompt, the others what they keep (sim.capacity); 0 when not even one
    request fits. `kv_peak_tokens` only matters to stacks without continuous batching."""
    s = make_setup(hw, model, policy, weight_dtype, kv_dtype, profile)
    n = np.asarray(prompt, float)
    peak = (kvlen.peak_kv_tokens(s.policy, n, gen, cache_ratio, model=s.model) if kv_peak_tokens is None
            else np.asarray(kv_peak_tokens, float))
    return capacity.max_batch_steady(s, n, np.asarray(beams, float), peak, kvlen.windowed(s.model, n),
                                     kvlen.steady_kv_tokens(s.policy, n, gen, cache_ratio, model=s.model))


def max_batch_all_at_once(hw, model, prompt, gen, *, policy="full", cache_ratio=1.0, beams=1, kv_dtype="bf16",
                          weight_dtype="bf16", profile="fused", kv_peak_tokens=None):
    """Largest batch (requests) whose peak memory fits with every request at its peak at once (a static
    batch, or a server reserving each request's peak); 0 when not even one fits."""
    s = make_setup(hw, model, policy, weight_dtype, kv_dtype, profile)
    peak_tokens = (kvlen.peak_kv_tokens(policy, prompt, gen, cache_ratio, model=s.model) if kv_peak_tokens is None
                   else np.asarray(kv_peak_tokens, float))
    return capacity.max_batch_all_at_once(s, np.asarray(prompt, float), np.asarray(beams, float), peak_tokens)


class _NoDevice:
    """Stands in for a device where only memory is computed (no timing): the Device contract with unit
    figures and no calibrated tables."""
    name, memory_bytes, memory_bw, launch_overhead_s, host_overhead_s = "none", math.inf, 1.0, 0.0, 0.0
    tables = NEUTRAL

    @staticmethod
    def peak_flops(dtype):
        return 1.0

    @staticmethod
    def compute_efficiency(flops):
        return np.ones(np.shape(flops))

    @staticmethod
    def compute_equivalent_flops(flops, peak):
        return flops


_NO_DEVICE = _NoDevice()


# ----------------------------------------------------------------------------------------------------
# Request-level latency over many points

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


def _check_override(kv_override, gen: int, n_layers: int) -> np.ndarray:
    arr = np.asarray(kv_override, dtype=float)
    t = max(int(gen) - 1, 1)
    if arr.ndim != 2 or arr.shape[1] != n_layers or arr.shape[0] < t:
        raise ValueError(f"kv_override must have shape (gen+1, n_layers) = ({gen + 1}, {n_layers}), got {arr.shape}")
    if not np.all(np.isfinite(arr)) or (arr < 0).any():
        raise ValueError("kv_override must hold finite, non-negative token counts")
    return arr[:t]


def _drop_layer_axis(t: TimedOps) -> TimedOps:
    """(ops, P, nodes, 1) -> (ops, P, nodes) when all layers are alike."""
    if t.time.ndim != 4:
        return t
    return TimedOps(t.names, {f: v[..., 0] for f, v in t.fields.items()}, t.t_compute[..., 0], t.t_memory[..., 0],
                    t.time[..., 0], t.step_time[..., 0], t.inside)


def _latency(s: Setup, batch, beams, prompt, gen, cache_ratio, recent_ratio, kv_override=None, keep_ops=False,
             parts=("prefill", "decode"), decode_batch=None):
    """ttft, tpot (mean over gen-1 decode steps), e2e, plus decode diagnostics; arrays of shape (P,).
    `parts` may skip the prefill or the decode (its outputs are then 0); `decode_batch` (default `batch`)
    is the batch the decode runs at."""
    col = lambda a: np.asarray(a, float)[:, None, None]                      # (P, 1, 1)
    b, k, n, p, r = col(batch), col(beams), col(prompt), col(cache_ratio), col(recent_ratio)
    bd = b if decode_batch is None else col(decode_batch)
    per_point = {f: col(getattr(s, f)) for f in ("wb", "kvb", "ab", "peak_gemm", "peak_vector")
                 if np.ndim(getattr(s, f))}
    if per_point:                                                            # mixed dtypes: widths per point
        s = replace(s, **per_point)
    keep = FIELDS if keep_ops else ("kv_read_bytes",)
    zeros = np.zeros(np.shape(b)[0])
    if "prefill" in parts:
        pre = _drop_layer_axis(time_ops(s, forward_ops(make_ctx(s, "prefill", b, k, n, 0.0, p, r)), keep=keep))
        ttft = pre.step_time[:, 0]
    else:
        pre, ttft = None, zeros
    if "decode" not in parts:
        return dict(ttft_s=ttft, tpot_s=zeros, e2e_s=ttft)
    lean = "prefill" not in parts and not keep_ops       # capacity's decode-only pass: TPOT alone
    nodes, weights = decode_nodes(s.policy, gen, kv_override)                # (P or 1, nodes)
    if kv_override is None:
        past, slots = kvlen.kv_tokens(s.policy, n[..., 0], nodes, p[..., 0], model=s.model)[..., None], 1
    else:
        past, slots = np.asarray(kv_override, float)[None, :, :], s.model.n_layers
    dec = _drop_layer_axis(time_ops(s, forward_ops(make_ctx(s, "decode", bd, k, 1.0, past, p, r)),
                                    layer_slots=slots, keep=keep))
    t_steps = np.maximum(np.asarray(gen, float) - 1.0, 0.0)
    mean = lambda a: (a * weights).sum(-1)                                   # over decode-step nodes
    tpot = np.where(t_steps > 0, mean(dec.step_time), 0.0)
    if lean:
        return dict(ttft_s=ttft, tpot_s=tpot, e2e_s=ttft + t_steps * tpot)
    tm, tc = mean(dec.t_memory.sum(0)), mean(dec.t_compute.sum(0))
    out = dict(ttft_s=ttft, tpot_s=tpot, e2e_s=ttft + t_steps * tpot,
               decode_memory_time_s=tm, decode_compute_time_s=tc,
               decode_kv_read_bytes=mean(dec.fields["kv_read_bytes"].sum(0)),
               decode_bound=np.where(tm >= tc, "memory", "compute"))
    if keep_ops:
        out.update(_prefill=pre, _decode=dec, _weights=weights)
    return out


def _per_point_dtypes(s: Setup, weight_dtype, kv_dtype, n: int) -> Setup:
    """A Setup whose dtype widths and peaks are per-point arrays, when the points mix dtypes."""
    if isinstance(weight_dtype, str) and isinstance(kv_dtype, str):
        return s
    hw = s.hw

    def per_point(values, fn):
        arr = np.broadcast_to(np.asarray(values, dtype=object), (n,)).astype(str)
        uniq, inverse = np.unique(arr, return_inverse=True)
        return np.array([fn(canonical_dtype(u)) for u in uniq], dtype=float)[inverse]

    return replace(s, weight_dtype="mixed" if not isinstance(weight_dtype, str) else s.weight_dtype,
                   kv_dtype="mixed" if not isinstance(kv_dtype, str) else s.kv_dtype, act_dtype="mixed",
                   wb=per_point(weight_dtype, dtype_bytes), kvb=per_point(kv_dtype, dtype_bytes),
                   ab=per_point(weight_dtype, lambda d: dtype_bytes(activation_dtype(d))),
                   peak_gemm=per_point(weight_dtype, hw.peak_flops),
                   peak_vector=per_point(weight_dtype, lambda d: hw.peak_flops(activation_dtype(d))))


def evaluate(hw, model, policy, *, batch, prompt, gen, cache_ratio=1.0, recent_ratio=0.3, beams=1,
             kv_dtype="bf16", weight_dtype="bf16", profile="fused", kv_override=None, with_capacity=True,
             _keep_ops=False) -> dict:
    """All results for arrays of points sharing (device, model, policy, profile).

    Every numeric argument may be an array (broadcast together); `kv_dtype` and `weight_dtype` may be
    a name or an array of names, one per point."""
    arrays = np.broadcast_arrays(*(np.atleast_1d(np.asarray(v, float)) for v in
                                   (batch, beams, prompt, gen, cache_ratio, recent_ratio)))
    batch, beams, prompt, gen, cache_ratio, recent_ratio = arrays
    first = lambda d: d if isinstance(d, str) else str(np.asarray(d, dtype=object).ravel()[0])
    s = make_setup(hw, model, policy, first(weight_dtype), first(kv_dtype), profile)
    s = _per_point_dtypes(s, weight_dtype, kv_dtype, batch.size)
    _validate_points(batch, beams, prompt, gen, cache_ratio, recent_ratio)
    if kv_override is not None:
        if batch.size != 1:
            raise ValueError("kv_override applies to a single design point")
        held = kvlen.windowed_per_layer(s.model, kv_override).mean(axis=1)   # all rows, incl. after the last step
        kv_override = kvlen.windowed_per_layer(s.model, _check_override(kv_override, int(gen[0]), s.model.n_layers))
        # same convention as kvlen.peak_kv_tokens: full reserves its final length (last row = n+gen);
        # an evicting policy holds one token over its budget between append and eviction
        appended = policies.get(s.policy).appended_tokens
        peak_tokens = np.array([max(float(kvlen.windowed(s.model, prompt[0])), held.max() + appended)])
    else:
        peak_tokens = kvlen.peak_kv_tokens(s.policy, prompt, gen, cache_ratio, model=s.model)
    # one pass over the operator tables for the points and, stacked after them, the capacity batches:
    # prefill at (batch, all-at-once batch, steady prefill rows), decode at (batch, all at once, steady)
    if with_capacity:
        every, steady, per_prefill = _capacity_batches(s, beams, prompt, gen, cache_ratio, kv_override, peak_tokens)
        pre, dec = [batch, np.maximum(every, 1), per_prefill], [batch, np.maximum(every, 1), np.maximum(steady, 1)]
    else:
        pre = dec = [batch]
    lat = _stacked_latency(s, pre, dec, beams, prompt, gen, cache_ratio, recent_ratio, kv_override, _keep_ops)
    n = batch.size
    out = {key: (v[:n] if not key.startswith("_") else v) for key, v in lat.items()}
    out["tokens_per_s"] = batch * gen / out["e2e_s"]
    m = s.model
    out["kv_bytes_per_token"] = np.broadcast_to(2.0 * m.n_layers * m.n_kv_heads * m.head_dim * s.kvb, batch.shape)
    out["weight_bytes"] = np.broadcast_to(m.n_params() * s.wb, batch.shape)
    out["peak_kv_tokens"] = peak_tokens
    out["peak_memory_bytes"] = capacity.memory(s, batch * beams, peak_tokens, prompt)
    out["fits"] = out["peak_memory_bytes"] <= float(s.hw.memory_bytes)
    if with_capacity:
        part = lambda key, i: lat[key][i * n:(i + 1) * n]
        every_e2e = part("e2e_s", 1)                      # prefill and decode both at the all-at-once batch
        out.update(max_batch_all_at_once=every,
                   max_batch_all_at_once_tokens_per_s=np.where(every > 0, every * gen / every_e2e, 0.0),
                   max_batch=steady,
                   max_batch_tokens_per_s=capacity.saturated_tokens_per_s(steady, gen, per_prefill, part("ttft_s", 2),
                                                                          part("tpot_s", 2)),
                   max_batch_tpot_s=np.where(steady > 0, part("tpot_s", 2), np.nan))
    return out


def _stacked_latency(s: Setup, prefill_batches, decode_batches, beams, prompt, gen, cache_ratio, recent_ratio,
                     kv_override, keep_ops) -> dict:
    """_latency for the points repeated once per entry of `prefill_batches` (each of the points' shape),
    prefilling at those batches and decoding at the matching `decode_batches`: one pass over the
    operator tables, so their per-call cost is paid once (sweeps evaluate many small groups)."""
    k = len(prefill_batches)
    tile = (lambda a: np.tile(np.asarray(a, float), k) if np.ndim(a) else a) if k > 1 else (lambda a: a)
    per_point = {f: tile(getattr(s, f)) for f in ("wb", "kvb", "ab", "peak_gemm", "peak_vector")
                 if np.ndim(getattr(s, f))}
    stacked = replace(s, **per_point) if per_point and k > 1 else s
    join = (lambda arrays: np.concatenate([np.asarray(a, float) for a in arrays])) if k > 1 else (lambda a: a[0])
    return _latency(stacked, join(prefill_batches), tile(beams), tile(prompt), tile(gen), tile(cache_ratio),
                    tile(recent_ratio), kv_override, keep_ops=keep_ops, decode_batch=join(decode_batches))


def _capacity_batches(s: Setup, beams, prompt, gen, cache_ratio, kv_override, peak_tokens):
    """(all-at-once max batch, steady-state max batch, requests prefilled at once in the steady state)."""
    every = capacity.max_batch_all_at_once(s, prompt, beams, peak_tokens)
    if not capacity.continuous(s):                        # a static batch: the steady state is all at once
        return every, every, np.maximum(every, 1).astype(float)
    held = (kvlen.steady_kv_tokens(s.policy, prompt, gen, cache_ratio, model=s.model) if kv_override is None
            else np.array([capacity.held_tokens_from_override(s.policy, kv_override)]))
    steady = capacity.max_batch_steady(s, prompt, beams, peak_tokens, kvlen.windowed(s.model, prompt), held)
    return every, steady, capacity.prefilling(s, np.maximum(steady, 1), prompt)


def _validate_points(batch, beams, prompt, gen, cache_ratio, recent_ratio):
    checks = [(batch >= 1, "batch must be >= 1"), (beams >= 1, "beams must be >= 1"),
              (prompt >= 1, "prompt must be >= 1 token"), (gen >= 1, "gen must be >= 1 token"),
              ((cache_ratio > 0) & (cache_ratio <= 1), "cache ratio must be in (0, 1]"),
              ((recent_ratio >= 0) & (recent_ratio <= 1), "recent ratio must be in [0, 1]")]
    for ok, message in checks:
        if not np.all(ok):
            raise ValueError(message)


# ----------------------------------------------------------------------------------------------------
# One point with its operator tables

TABLE_COLUMNS = ["op", *FIELDS, "intensity", "bound", "time_s"]


def _table(timed: TimedOps, index, weights=None) -> pd.DataFrame:
    """Operator table of one point; `weights` averages over decode-step nodes."""
    def pick(a):
        a = a[(slice(None),) + index]
        return (a * weights).sum(-1) if weights is not None else a
    data = {"op": timed.names, **{f: pick(timed.fields[f]) for f in FIELDS}}
    df = pd.DataFrame(data)
    total_bytes = df[list(BYTE_FIELDS)].sum(axis=1)
    df["intensity"] = np.where(total_bytes > 0, df["flops"] / total_bytes.where(total_bytes > 0, 1), np.inf)
    tc, tm = pick(timed.t_compute), pick(timed.t_memory)
    df["bound"] = np.where(tc >= tm, "compute", "memory")
    if timed.inside is not None:     # an op inside another's kernel: its time and bound are on that row
        df.loc[[host is not None for host in timed.inside], "bound"] = "fused"
    df["time_s"] = pick(timed.time)
    df = df.groupby("op", sort=False, as_index=False).agg(
        {**{f: "sum" for f in FIELDS}, "intensity": "first", "bound": "first", "time_s": "sum"})[TABLE_COLUMNS]
    # data-flow order for reading; a profile's extra ops follow the core ones
    order = {name: i for i, name in enumerate(CORE_OPS)}
    return df.sort_values("op", key=lambda c: c.map(lambda n: order.get(n, len(order))), kind="stable",
                          ignore_index=True)


@dataclass
class Prediction:
    inputs: dict
    ttft_s: float
    tpot_s: float
    e2e_s: float
    tokens_per_s: float
    peak_memory_bytes: float
    max_batch: int                # steady state of continuous batching (sim.capacity)
    max_batch_tokens_per_s: float
    prefill_ops: pd.DataFrame
    decode_ops: pd.DataFrame      # rows for step in {first, mean, last}; column "step"
    extra: dict = field(default_factory=dict)
    max_batch_all_at_once: int = 0            # every request at its peak at once (static batch, reserve admission)
    max_batch_all_at_once_tokens_per_s: float = 0.0

    def summary(self) -> dict:
        keys = ("ttft_s", "tpot_s", "e2e_s", "tokens_per_s", "peak_memory_bytes", "max_batch", "max_batch_tokens_per_s",
                "max_batch_all_at_once", "max_batch_all_at_once_tokens_per_s")
        return {k: getattr(self, k) for k in keys}

    def to_dict(self) -> dict:
        return {**self.inputs, **self.summary(), **self.extra}

    def to_json(self, **kw) -> str:
        return json.dumps(self.to_dict(), **kw)


def predict(hw, model, batch, prompt, gen, policy, cache_ratio, recent_ratio=0.3, kv_dtype="bf16",
            weight_dtype="bf16", profile="fused", kv_override=None, beams=1) -> Prediction:
    s = make_setup(hw, model, policy, weight_dtype, kv_dtype, profile)
    r = evaluate(s.hw, s.model, s.policy, batch=batch, prompt=prompt, gen=gen, cache_ratio=cache_ratio,
                 recent_ratio=recent_ratio, beams=beams, kv_dtype=s.kv_dtype, weight_dtype=s.weight_dtype,
                 profile=s.profile, kv_override=kv_override, _keep_ops=True)
    pre, dec, weights = r["_prefill"], r["_decode"], r["_weights"]
    prefill_ops = _table(pre, (0, 0))
    last = weights.shape[-1] - 1
    tables = []
    for label, index, w in (("first", (0, 0), None), ("mean", (0, slice(None)), weights[0]), ("last", (0, last), None)):
        t = _table(dec, index, w)
        t.insert(0, "step", label)
        tables.append(t)
    inputs = dict(hw=s.hw.name, model=s.model.name, batch=int(batch), beams=int(beams), prompt=int(prompt),
                  gen=int(gen),
                  policy=s.policy, cache_ratio=float(cache_ratio), recent_ratio=float(recent_ratio),
                  kv_dtype=s.kv_dtype, weight_dtype=s.weight_dtype, profile=s.profile.name,
                  kv_source="trace" if kv_override is not None else "formula")
    extra = dict(decode_bound=str(r["decode_bound"][0]), kv_bytes_per_token=float(r["kv_bytes_per_token"][0]),
                 peak_kv_tokens=float(r["peak_kv_tokens"][0]), weight_bytes=float(s.model.weight_bytes(s.weight_dtype)),
                 decode_kv_read_bytes=float(r["decode_kv_read_bytes"][0]), fits=bool(r["fits"][0]),
                 device_memory_bytes=float(s.hw.memory_bytes),
                 exceeds_max_positions=bool(s.model.max_positions and prompt + gen > s.model.max_positions))
    return Prediction(inputs=inputs, ttft_s=float(r["ttft_s"][0]), tpot_s=float(r["tpot_s"][0]),
                      e2e_s=float(r["e2e_s"][0]), tokens_per_s=float(r["tokens_per_s"][0]),
                      peak_memory_bytes=float(r["peak_memory_bytes"][0]), max_batch=int(r["max_batch"][0]),
                      max_batch_tokens_per_s=float(r["max_batch_tokens_per_s"][0]),
                      prefill_ops=prefill_ops, decode_ops=pd.concat(tables, ignore_index=True), extra=extra,
                      max_batch_all_at_once=int(r["max_batch_all_at_once"][0]),
                      max_batch_all_at_once_tokens_per_s=float(r["max_batch_all_at_once_tokens_per_s"][0]))
