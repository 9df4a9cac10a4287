"""Device memory and capacity: how many requests fit, all at once or in the steady state of continuous
batching (docs/sim.md "Memory and capacity"). Functions of a resolved sim.engine.Setup; the public
entries with names (memory_bytes, max_batch, ...) are in sim.engine.

Two answers to "how large a batch fits":
- all at once (`max_batch_all_at_once`): every request of the batch holds its peak at the same time
  (the whole prompt during prefill, full attention its final n + gen). What a static batch needs, and
  what a server that reserves each request's peak at admission (the DES's `--admission reserve`) runs.
- steady state (`max_batch`): continuous batching with on-demand KV blocks (vLLM's PagedAttention, the
  DES's default `--admission paged`). The requests in flight are at every point of their lives at once,
  so each counts at what it holds averaged over its life of prefill steps and decode steps
  (`life_tokens`): its prompt while it is prefilled (one step per prefill chunk), then what it keeps at
  each decode step (prompt + generated so far for full attention, k + 1 for an evicting policy). For
  128 + 2048 that is about n + g/2 = 1,152 tokens a request, where counting a whole chunk's worth of
  requests (64 of 128 tokens) at their bare prompt overstated the batch by 45%. One chunk of prefill
  activations is held as workspace. A stack without continuous batching (a profile with no prefill
  chunking, e.g. hf-eager's static batches) gets the all-at-once answer.

The DES at --qps inf (`sim.serve`, chunked prefill of the profile's chunk) sustains this batch within a few
percent once its window excludes the first lives and the drain (tests/sim/test_capacity_steady.py). What
the analytic steady state does not model: KV blocks (the DES rounds what a request holds up to whole
blocks of --block-size tokens: + block/2 a request for a growing cache, up to a block for an evicting
one, e.g. k + 1 = 65 held in 80), and the waves that identical requests arriving at once run in without
chunked prefill (prefill-first steps admit a cohort that then finishes together; 2048 + 128 full sustains
0.82 of the steady batch there, docs/metrics.md "Steady state").
"""
from __future__ import annotations

import math

import numpy as np

from sim import policies
from sim.op import SCORE_BYTES

MAX_BATCH_LIMIT = 1 << 22       # search ceiling for max_batch (4M sequences)


def memory(s, rows, kv_tokens, prompt, prefill_rows=None):
    """Device memory: weights + KV (rows x kv_tokens per KV head) + fp32 score state + one layer's prefill
    activations of `prefill_rows` prompts (default: all rows) + logits + the profile's own buffers."""
    m, prof = s.model, s.profile
    kv = rows * kv_tokens * (2 * m.n_layers * m.n_kv_heads * m.head_dim) * s.kvb
    # the policy's own state (accumulated scores: one fp32 score per kept token, KV head and layer)
    scores = policies.get(s.policy).state_bytes(m, rows, kv_tokens)
    # one layer's activations live at a time: residual, normed input, q/k/v, MLP intermediate
    act_per_token = m.layer_activation_elems() * s.ab
    prefill_tokens = (rows if prefill_rows is None else prefill_rows) * prompt
    if prof.prefill_chunk_tokens is not None:
        prefill_tokens = np.minimum(prefill_tokens, prof.prefill_chunk_tokens)
    workspace = prefill_tokens * act_per_token + rows * (m.vocab_size * SCORE_BYTES)
    extra = prof.extra_memory_bytes(s, rows, kv_tokens, prompt) if prof.extra_memory_bytes is not None else 0.0
    return m.weight_bytes_at(s.wb) + kv + scores + workspace + extra


def _largest(mem, cap, shape, upper, knots=()):
    """Largest batch b >= 1 with mem(b) <= cap; 0 when not even one request fits. `upper`: a batch known
    not to be exceeded; `knots`: the batches where mem(b), piecewise linear in b for the shipped
    profiles, changes slope. mem is read at the knots and inverted linearly between them, and the answer
    is checked at b and b + 1; where that check fails (a profile whose memory is not piecewise linear
    with those knots) a vectorised bisection decides, which needs only that memory grows with the batch."""
    hi = np.minimum(np.floor(np.broadcast_to(np.maximum(upper, 1.0), shape)), float(MAX_BATCH_LIMIT)) + 1.0
    inner = [np.clip(np.broadcast_to(k, shape), 1.0, hi) for k in knots]        # each within [1, hi]
    if len(inner) == 2:                                     # sorted: the knots' order, between 1 and hi
        inner = [np.minimum(*inner), np.maximum(*inner)]
    elif len(inner) > 2:
        inner = list(np.sort(np.stack(inner), axis=0))
    points = np.stack([np.ones(shape), *inner, hi])
    values = np.broadcast_to(mem(points), points.shape)    # memory is elementwise: one call for all knots
    guess = np.ones(shape)
    for (b0, b1), (m0, m1) in zip(zip(points[:-1], points[1:]), zip(values[:-1], values[1:])):
        crossing = (m0 <= cap) & (cap < m1)
        step = np.where(m1 > m0, (cap - m0) / np.where(m1 > m0, m1 - m0, 1.0), 0.0)
        guess = np.where(crossing, b0 + step * (b1 - b0), guess)
    guess = np.where(values[-1] <= cap, points[-1], guess)
    b0 = np.maximum(np.floor(guess + 1e-9), 1.0)
    below, at, next_, after = np.broadcast_to(mem(b0 + np.arange(-1.0, 3.0).reshape(-1, *(1,) * b0.ndim)),
                                              (4,) + b0.shape)             # mem(b0 - 1 ... b0 + 2) in one call
    up = next_ <= cap                                       # rounding at the crossing: one step either way
    b, mem_b = np.where(up, b0 + 1, b0), np.where(up, next_, at)
    down = (mem_b > cap) & (b > 1)
    b = np.where(down, b - 1, b)
    ok = np.where(down, np.where(up, at, below), mem_b) <= cap
    above = np.where(down, mem_b, np.where(up, after, next_)) <= cap
    fits_one = values[0] <= cap
    settled = ~fits_one | (ok & ~above) | (ok & (b >= hi))
    if not settled.all():                                   # not piecewise linear here: bisect
        lo, top = np.zeros(shape), hi.copy()
        for _ in range(int(math.ceil(math.log2(float(hi.max())))) + 1):
            mid = np.floor((lo + top) / 2)
            good = mem(np.maximum(mid, 1)) <= cap
            lo, top = np.where(good, mid, lo), np.where(good, top, mid)
        b = np.where(settled, b, lo)
    return np.where(fits_one, b, 0).astype(np.int64)


def _batch_bound(s, beams, least_tokens):
    """No batch above this fits: weights + per request at least `least_tokens` of KV and a row of logits."""
    m = s.model
    per_row = least_tokens * (2 * m.n_layers * m.n_kv_heads * m.head_dim) * s.kvb + m.vocab_size * SCORE_BYTES
    free = float(s.hw.memory_bytes) - m.weight_bytes_at(s.wb)
    return np.maximum(free, 0.0) / (np.asarray(beams, float) * per_row)


def max_batch_all_at_once(s, prompt, beams, peak_tokens):
    """Largest batch whose requests all hold their peak (`peak_tokens`) at once."""
    cap = float(s.hw.memory_bytes)
    shape = np.broadcast_shapes(*(np.shape(a) for a in (prompt, beams, peak_tokens, s.wb, s.kvb)))
    chunk = s.profile.prefill_chunk_tokens
    knots = () if chunk is None else (float(chunk) / (np.asarray(beams, float) * np.asarray(prompt, float)),)
    return _largest(lambda b: memory(s, b * beams, peak_tokens, prompt), cap, shape,
                    _batch_bound(s, beams, peak_tokens), knots)


def continuous(s) -> bool:
    """Whether the stack batches continuously (admits requests as others finish, prefills a bounded
    chunk at a time): profiles with a prefill chunk bound. Static-batch stacks (None) do not."""
    return s.profile.prefill_chunk_tokens is not None


def prefilling(s, batch, prompt):
    """Prompts one prefill chunk takes at once (at least one, at most the batch): the rows of the prefill
    activation workspace and of the prefill steps that `saturated_tokens_per_s` times."""
    per_chunk = np.maximum(np.floor(float(s.profile.prefill_chunk_tokens) / np.asarray(prompt, float)), 1.0)
    return np.minimum(np.asarray(batch, float), per_chunk)


def life_tokens(s, prompt, gen, prompt_tokens, held_tokens):
    """Tokens per KV head a request holds averaged over the steps of its life in a continuous batch: P
    prefill steps (P = ceil(n / chunk); step j holds the j chunks computed so far, `prompt_tokens` once all
    are) and gen - 1 decode steps holding `held_tokens` on average (the policy's steady_kv_tokens)."""
    n, decode_steps = np.asarray(prompt, float), np.maximum(np.asarray(gen, float) - 1.0, 0.0)
    chunks = np.maximum(np.ceil(n / float(s.profile.prefill_chunk_tokens)), 1.0)
    prefill_mean = np.asarray(prompt_tokens, float) * (chunks + 1.0) / (2.0 * chunks)   # j/P of it at step j
    return (chunks * prefill_mean + decode_steps * np.asarray(held_tokens, float)) / (chunks + decode_steps)


def steady_memory(s, batch, beams, prompt, gen, prompt_tokens, held_tokens):
    """Memory of a steady-state batch: every request at `life_tokens` (its prompt while prefilled, then
    what it keeps), plus one chunk of prefill activations."""
    pre = prefilling(s, batch, prompt)
    return memory(s, batch * beams, life_tokens(s, prompt, gen, prompt_tokens, held_tokens), prompt,
                  prefill_rows=pre * beams)


def max_batch_steady(s, prompt, beams, peak_tokens, prompt_tokens, held_tokens, gen):
    """Largest steady-state batch under continuous batching (the all-at-once answer for static stacks)."""
    if not continuous(s):
        return max_batch_all_at_once(s, prompt, beams, peak_tokens)
    cap = float(s.hw.memory_bytes)
    shape = np.broadcast_shapes(*(np.shape(a) for a in (prompt, gen, beams, prompt_tokens, held_tokens, s.wb,
                                                        s.kvb)))
    chunk, n = float(s.profile.prefill_chunk_tokens), np.asarray(prompt, float)
    knots = (prefilling(s, MAX_BATCH_LIMIT, n), chunk / (np.asarray(beams, float) * n))
    return _largest(lambda b: steady_memory(s, b, beams, prompt, gen, prompt_tokens, held_tokens), cap, shape,
                    _batch_bound(s, beams, life_tokens(s, prompt, gen, prompt_tokens, held_tokens)), knots)


def held_tokens_from_override(policy: str, kv_rows) -> float:
    """Steady-state tokens per KV head from a trace's decode rows (layer means): the mean over the
    request's decode steps of what each step holds, including the token it appends."""
    return float(np.mean(kv_rows) + 1.0)


def saturated_tokens_per_s(batch, gen, prefill_rows, ttft_at_prefill_rows, tpot_at_batch):
    """Output tokens/s of a server holding `batch` requests, each passing once through a prefill step of
    `prefill_rows` prompts and gen - 1 decode steps of the whole batch (prefill and decode steps
    alternate, as the DES runs them without chunking): batch * gen / (batch / prefill_rows * TTFT +
    (gen - 1) * TPOT)."""
    cycle = batch / np.maximum(prefill_rows, 1.0) * ttft_at_prefill_rows + np.maximum(gen - 1.0, 0.0) * tpot_at_batch
    return np.where(batch > 0, batch * gen / np.where(cycle > 0, cycle, 1.0), 0.0)
