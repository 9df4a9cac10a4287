"""Published GPU measurements as fit and validation rows for the engine profiles: each row predicted as it was
measured. The rows are read by sim.validation.published_rows (re-exported here).

Metrics:
  out_tok_per_s  fixed batch: batch x gen / end-to-end time of the whole batch (engine.evaluate's
                 tokens_per_s); in-flight batching: the steady state below.
  ttft_ms        prefill of the batch, first token (engine ttft_s); at a request rate: below.
  e2e_latency_s  whole-batch end-to-end time.
  tpot_ms        mean time per output token (itl_ms, median_itl_ms and avg_tpot_s read as it).
  speedup_fp8_vs_fp16  end-to-end time with 16-bit weights and KV over the time with FP8 ones.

How each batch kind runs (published_rows.batch_of says how cells read):
  static       the fixed batch through the engine (prefill and decode steps).
  dynamic      in-flight batching at saturation: the scheduler admits requests while their whole
               reservation fits the KV pool (TensorRT-LLM's GUARANTEED_NO_EVICT reserves prompt + gen
               tokens); the pool is KV_POOL_FRACTION of the memory left after the weights; at most
               MAX_BATCH_SIZE requests at once. B requests of n + T tokens then cost, per generation of B
               requests, T decode steps at batch B over the mean held context n + T/2 plus B prompt prefills
               packed into steps of at most MAX_NUM_TOKENS tokens (steady_state).
  max-seqs     a saturated server capped at N sequences: the same steady state at B = min(N, what the KV pool
               holds at the mean context n + T/2: vLLM allocates blocks as tokens arrive, no reservation).
  max-static   a fixed batch as large as the KV pool holds for prompt + gen tokens each, beside buffers sized
               for the batch itself: with in-flight batching off one context pass prefills all of it
               (static_max_batch).
  qps          an open-loop rate q below saturation, through the DES (des_rate: Poisson arrivals at q, the
               run's request count, reserve admission). Its closed-form stand-in (Little's law, `des=False`,
               which the fit descends on: sim.fit_profiles): L = q (TTFT + (T - 1) ITL) requests in flight;
               each decode step is one step at batch L, stretched by the share q * t_prefill of time the engine
               spends prefilling newcomers; TTFT = one request's prefill plus half a decode step. Little's law
               misses the queueing of a newcomer behind the step in flight and the prefills ahead of it (TTFT
               25-30% short on TRT014S). QPS INF (all at once) is the dynamic steady state.
"""
from __future__ import annotations

import dataclasses
import math
from functools import lru_cache

import numpy as np

from sim import engine
from sim.op import SCORE_BYTES
from sim.profiles import get_profile
from sim.profiles.engines import Kernels, make_profile
from sim.validation.published_rows import (BATCH_KINDS, CSV_NAME, CSV_NAMES, COLUMNS, METRICS, REGIMES,  # noqa: F401
                                           REPO_ROOT, Row, batch_of, classify_stack, data_dir, default_csv,
                                           default_csvs, display_path, file_sha256, in_scope, load_rows,
                                           regime_of)

# TensorRT-LLM defaults for the steady state, as its documentation states them (KvCacheConfig
# free_gpu_memory_fraction = 0.9, capacity_scheduler_policy GUARANTEED_NO_EVICT; BuildConfig max_batch_size =
# 2048, max_num_tokens = 8192); vLLM's gpu_memory_utilization default is 0.9 too and its
# max-num-batched-tokens 8192 in the rows that state it. The project's reading of the docs, not re-checked
# against each release (trtllm-bench may tune them per run).
KV_POOL_FRACTION = 0.9
MAX_BATCH_SIZE = 2048
MAX_NUM_TOKENS = 8192
LITTLE_ITERATIONS = 12


def _kw(row: Row) -> dict:
    return dict(weight_dtype=row.weight_dtype, kv_dtype=row.kv_dtype, policy="full")


def _static_out(row: Row, profile, batch: int, weight_dtype=None, kv_dtype=None) -> dict:
    return engine.evaluate(row.hw, row.model, "full", batch=batch, prompt=row.prompt, gen=row.gen,
                           kv_dtype=kv_dtype or row.kv_dtype, weight_dtype=weight_dtype or row.weight_dtype,
                           profile=profile, with_capacity=False)


def _static(row: Row, profile, batch: int) -> float:
    if row.metric == "speedup_fp8_vs_fp16":
        slow = _static_out(row, profile, batch, "fp16", "fp16" if row.kv_dtype == "fp8" else row.kv_dtype)
        fast = _static_out(row, profile, batch, "fp8", row.kv_dtype)
        return float(slow["e2e_s"][0]) / float(fast["e2e_s"][0])
    out = _static_out(row, profile, batch)
    if row.metric == "ttft_ms":
        return float(out["ttft_s"][0]) * 1e3
    if row.metric == "e2e_latency_s":
        return float(out["e2e_s"][0])
    if row.metric == "tpot_ms":
        return float(out["tpot_s"][0]) * 1e3
    return float(out["tokens_per_s"][0])


@lru_cache(maxsize=None)
def _memory(row: Row) -> tuple[float, float, float]:
    """(device bytes of the TP group, weight bytes, KV bytes per token, each KV head stored as often as the TP
    group replicates it)."""
    from sim.models import load_model
    from sim.parallel.shard import kv_replication
    m = load_model(row.model)
    device = engine.resolve_device(row.hw)
    return (row.tp * float(device.memory_bytes), m.weight_bytes(row.weight_dtype),
            m.kv_bytes_per_token(row.kv_dtype) * kv_replication(m.n_kv_heads, row.tp))


@lru_cache(maxsize=None)
def engine_buffers(row: Row, tokens: int = MAX_NUM_TOKENS, sequences: int | None = None) -> float:
    """Bytes the engine allocates outside the KV pool that grow with the model, per device (derived, not
    fitted): the activations of one step of `tokens` tokens (ModelSpec.layer_activation_elems, as
    sim.capacity.memory counts them, TP-sharded, at 16 bits) and fp32 logits for the most sequences a step can
    hold (by default TensorRT-LLM's max_batch_size; vLLM's profiling run sizes them by max_num_seqs, the row's
    cap)."""
    from sim.models import load_model
    m = load_model(row.model)
    if sequences is None:
        sequences = row.batch if row.batch_kind == "max-seqs" else MAX_BATCH_SIZE
    return tokens * m.layer_activation_elems(row.tp) * 2.0 + sequences * m.vocab_size * SCORE_BYTES


def _pool_tokens(row: Row, profile=None, buffers: float | None = None) -> float:
    """KV tokens the pool holds. TensorRT-LLM: KV_POOL_FRACTION of the memory free after the weights, the
    engine's buffers and its fixed reserve (free_gpu_memory_fraction); vLLM: KV_POOL_FRACTION of all memory
    less the same (gpu_memory_utilization). The reserve is an engine profile's runtime_reserve_gb per device
    (none for the other profiles); `buffers`: bytes per device in place of engine_buffers(row)."""
    total, weights, per_token = _memory(row)
    terms = dict(getattr(profile, "terms", None) or ())
    buffers = engine_buffers(row) if buffers is None else buffers
    held = weights + row.tp * (terms.get("runtime_reserve_gb", 0.0) * 1e9 + buffers)
    free = KV_POOL_FRACTION * total - held if row.engine == "vllm" else KV_POOL_FRACTION * (total - held)
    return max(free, 0.0) / per_token


def static_max_batch(row: Row, profile=None) -> float:
    """A max-static row's batch: the most requests whose prompt + gen tokens each fit the KV pool beside buffers
    sized for the batch. With in-flight batching off, one context pass prefills the whole batch, so the
    activations hold batch x prompt tokens (TensorRT-LLM before v0.10 sizes max_num_tokens as max_batch_size x
    max_input_len; sim.capacity counts a static batch's prefill the same way) and the logits batch sequences.
    The pool shrinks linearly with the buffers, so the batch solves B (prompt + gen) = pool(0) - B * (tokens
    one request's buffers take from the pool). At least 1, at most MAX_BATCH_SIZE; not rounded (`_between`)."""
    per_request = engine_buffers(row, tokens=row.prompt, sequences=1)
    empty = _pool_tokens(row, profile, buffers=0.0)
    taken = empty - _pool_tokens(row, profile, buffers=per_request)
    return max(min(float(MAX_BATCH_SIZE), empty / (row.prompt + row.gen + taken)), 1.0)


def steady_state_batch(row: Row, profile=None) -> float:
    """Requests in flight at saturation with every request reserving prompt + gen tokens (TensorRT-LLM's
    GUARANTEED_NO_EVICT), at most MAX_BATCH_SIZE; at least 1. Not rounded: predictions interpolate between
    the two whole batches around it (`_between`), the time average of a batch that alternates between them."""
    return max(min(float(MAX_BATCH_SIZE), _pool_tokens(row, profile) / (row.prompt + row.gen)), 1.0)


def capped_batch(row: Row, profile=None) -> float:
    """A max-seqs row's batch: its cap, or what the pool holds at the mean held context (no reservation)."""
    return max(min(float(row.batch), _pool_tokens(row, profile) / (row.prompt + row.gen / 2.0)), 1.0)


def _between(batch: float, value) -> float:
    """value(b) at a fractional batch: linear between floor and ceil."""
    lo = math.floor(batch)
    if batch - lo < 1e-9:
        return value(int(lo))
    w = batch - lo
    return (1.0 - w) * value(int(lo)) + w * value(int(lo) + 1)


def _prefill_per_request(row: Row, profile) -> float:
    """Prefill time per request with prompts packed into steps of at most MAX_NUM_TOKENS tokens (one ragged
    batch per step, engine.packed_prefill_time); a longer prompt in MAX_NUM_TOKENS chunks."""
    kw = dict(_kw(row), profile=profile)
    n = row.prompt
    if n <= MAX_NUM_TOKENS:
        per_step = max(MAX_NUM_TOKENS // n, 1)
        return engine.packed_prefill_time(row.hw, row.model, per_step, n, **kw) / per_step
    total, done = 0.0, 0
    while done < n:
        chunk = min(MAX_NUM_TOKENS, n - done)
        total += engine.packed_prefill_time(row.hw, row.model, 1, chunk, done, completes_prompt=done + chunk >= n,
                                            **kw)
        done += chunk
    return total


def _decode(row: Row, profile, batch: float) -> float:
    b = max(int(round(batch)), 1)
    return engine.decode_step_time(row.hw, row.model, np.full(b, row.prompt + row.gen / 2.0), profile=profile,
                                   **_kw(row))


def steady_state(row: Row, profile, batch: int) -> tuple[float, float]:
    """(output tokens/s, seconds per output token) of `batch` requests kept in flight: per generation of
    `batch` requests, gen decode steps plus `batch` prefills."""
    period = row.gen * _decode(row, profile, batch) + batch * _prefill_per_request(row, profile)
    return batch * row.gen / period, period / row.gen


def _rate(row: Row, profile) -> float:
    """A request-rate row below saturation (module docstring)."""
    prefill = _prefill_per_request(row, profile)
    busy = min(row.qps * prefill, 0.9)          # share of time spent prefilling newcomers
    in_flight, itl = 1.0, _decode(row, profile, 1)
    for _ in range(LITTLE_ITERATIONS):
        ttft = prefill + itl / 2.0
        in_flight = max(row.qps * (ttft + (row.gen - 1) * itl), 1.0)
        itl = _decode(row, profile, in_flight) / (1.0 - busy)
    return (prefill + itl / 2.0) * 1e3 if row.metric == "ttft_ms" else itl * 1e3


_ROW_PROFILES: dict = {}


def _engine_profile(resolved, engine: str, runtime: str, kernels: Kernels):
    """An engine profile's terms under `runtime` and `kernels` (cached: the fit predicts every row per step)."""
    key = (resolved.terms, engine, runtime, kernels)
    hit = _ROW_PROFILES.get(key)
    if hit is None:
        if len(_ROW_PROFILES) > 4096:
            _ROW_PROFILES.clear()
        hit = _ROW_PROFILES[key] = make_profile(engine, dict(resolved.terms), name=resolved.name, runtime=runtime,
                                                kernels=kernels)
    return hit


def row_profile(row: Row, profile):
    """`profile` (a name or a Profile) as the row's stack runs it: an engine profile's terms under the row's
    runtime (classic, pytorch, vllm-v0, vllm-v1) and decode kernels (stacks.yaml); fused and the eager
    profiles as named."""
    resolved = get_profile(profile)
    if resolved.terms is None:
        return resolved
    engine = row.engine or resolved.engine
    return _engine_profile(resolved, engine, row.runtime, Kernels(engine, row.decode_kernel, row.sliding_window_kernel))


def runtime_profile(runtime: str, profile):
    """`profile` under a runtime by name (sim.validation.multigpu's rows: a runtime, no kernel overrides)."""
    resolved = get_profile(profile)
    if resolved.terms is None:
        return resolved
    return _engine_profile(resolved, resolved.engine, runtime, Kernels(resolved.engine))


def is_rate_row(row: Row) -> bool:
    """A request-rate row below saturation: the DES predicts it (des_rate)."""
    return row.batch_kind == "qps" and not math.isinf(row.qps)


def predict_row(row: Row, profile, des: bool = True) -> float:
    """The simulator's value of the row's metric under `profile` (a name or a Profile), as the row's stack
    runs it (row_profile) and as it was measured (its batch kind). `des=False`: a request-rate row by its
    closed-form steady state (Little's law) instead of the DES."""
    if row.scope != "single-device":
        raise ValueError(f"row {row.index} ({row.id}) is out of scope: {row.scope}")
    if row.baseline is not None:
        return (predict_row(dataclasses.replace(row, baseline=None), profile, des)
                / predict_row(row.baseline, profile, des))
    if is_rate_row(row):
        return des_rate(row, profile) if des else _rate(row, row_profile(row, profile))
    profile = row_profile(row, profile)
    kind = row.batch_kind
    if kind == "static":
        return _static(row, profile, row.batch)
    if kind == "max-static":
        return _between(static_max_batch(row, profile), lambda b: _static(row, profile, b))
    batch = capped_batch(row, profile) if kind == "max-seqs" else steady_state_batch(row, profile)
    pick = 0 if row.metric == "out_tok_per_s" else 1
    scale = 1.0 if pick == 0 else 1e3
    return _between(batch, lambda b: steady_state(row, profile, b)[pick] * scale)


def error_pct(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured * 100.0


DES_REQUESTS = 500       # the TRT014S runs' request count
DES_STEP_GRID = 64       # decode steps on the DES grid (sim.des.step_grid: below 1e-4 relative): 2x faster
_DES_RUNS: dict = {}     # (row's run, id(profile), requests, seed) -> (profile, mean TTFT s, mean TPOT s)


def des_rate(row: Row, profile, requests: int = DES_REQUESTS, seed: int = 0) -> float:
    """A request-rate row through the DES (sim.des: Poisson arrivals at the row's rate, its lengths, prompts
    packed into steps of MAX_NUM_TOKENS, reserve admission as TensorRT-LLM's GUARANTEED_NO_EVICT): the mean TTFT
    or time per output token in ms. One run serves the TTFT and TPOT rows of the same run (memoised: the DES
    is a pure function of its inputs, seeded)."""
    from sim.des.serving import simulate
    if not is_rate_row(row):
        raise ValueError(f"row {row.index} ({row.id}) is not a request-rate row")
    profile = row_profile(row, profile)
    # by the profile's identity (row_profile hands out one object per set of terms); the entry holds the profile,
    # so its id is not reused while the entry lives
    key = (row.hw, row.model, row.kv_dtype, row.weight_dtype, row.qps, row.prompt, row.gen, id(profile), requests, seed)
    hit = _DES_RUNS.get(key)
    if hit is None:
        res = simulate(row.hw, row.model, "full", 1.0, qps=row.qps, requests=requests, prompt=row.prompt,
                       gen=row.gen, seed=seed, kv_dtype=row.kv_dtype, weight_dtype=row.weight_dtype,
                       profile=profile, max_step_tokens=MAX_NUM_TOKENS, admission="reserve", step_grid=DES_STEP_GRID)
        if len(_DES_RUNS) > 256:
            _DES_RUNS.clear()
        hit = _DES_RUNS[key] = (profile, float(res.ttft_s["mean"]), float(res.tpot_s["mean"]))
    return (hit[1] if row.metric == "ttft_ms" else hit[2]) * 1e3
