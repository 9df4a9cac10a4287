"""Step-level entries used by the DES (scalars in, float out; keep them cheap): one decode step, one mixed
step of decodes and prefill chunks, one prefill.
"""
from __future__ import annotations

import numpy as np

from sim.engine.setup import Setup, make_ctx, make_setup
from sim.engine.timing import step_time_scalar
from sim.ops import dense_ops, group_ops, once_per_step

_DENSE_MEMO: dict = {}


def dense_time(s: Setup, rows: float, beams: float, tokens_per_row: float) -> float:
    """Dense-op time depends only on the token and row counts, which repeat step after step in a DES."""
    key = (id(s), rows, beams, tokens_per_row)
    hit = _DENSE_MEMO.get(key)
    if hit is None or hit[1] is not s:
        if len(_DENSE_MEMO) > 65536:
            _DENSE_MEMO.clear()
        hit = _DENSE_MEMO[key] = (step_time_scalar(s, dense_ops(make_ctx(s, "prefill", rows / beams, beams,
                                                                                 tokens_per_row, 0.0)), host=False), s)
    return hit[0]


def decode_step_time(hw, model, kv_tokens, *, weight_dtype="bf16", kv_dtype="bf16", policy="full",
                     profile="auto", beams=1, recent_ratio=0.3) -> float:
    """One decode step for a batch whose request i holds kv_tokens[i] cached tokens per KV head
    (mean over layers). Attention cost follows the total kept tokens (one batched kernel)."""
    s = make_setup(hw, model, policy, weight_dtype, kv_dtype, profile)
    kv = kv_tokens if isinstance(kv_tokens, np.ndarray) else np.asarray(kv_tokens, dtype=float)
    if kv.size == 0:
        return 0.0
    beams = float(beams)
    ctx = make_ctx(s, "decode", float(kv.size), beams, 1.0, float(kv.mean()), recent_ratio=float(recent_ratio))
    return dense_time(s, ctx.rows, beams, 1.0) + step_time_scalar(s, group_ops(ctx))


def chunk_groups(s: Setup, chunks, beams, cache_ratio, recent_ratio):
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
                    policy="full", profile="auto", beams=1, cache_ratio=1.0, recent_ratio=0.3) -> float:
    """One step running decodes (request i holds decode_kv_tokens[i] tokens) and prefill chunks
    `(new_tokens, past_tokens[, completes_prompt])` together: the dense layers see all tokens at once,
    attention and policy ops run per group. A chunk completing its prompt (default) pays the policy's
    selection and compaction."""
    s = make_setup(hw, model, policy, weight_dtype, kv_dtype, profile)
    kv = np.asarray(decode_kv_tokens if decode_kv_tokens is not None else [], dtype=float).ravel()
    groups = chunk_groups(s, chunks, beams, cache_ratio, recent_ratio)
    if kv.size:
        groups.append(make_ctx(s, "decode", float(kv.size), float(beams), 1.0, float(kv.mean()),
                               recent_ratio=float(recent_ratio)))
    if not groups:
        return 0.0
    # dense ops depend on rows * new_tokens (tokens through the weights) and rows (logit rows)
    tokens = sum(g.rows * g.new_tokens for g in groups)
    logit_rows = sum(g.rows for g in groups)
    dense = dense_time(s, logit_rows, float(beams), tokens / logit_rows)
    return dense + step_time_scalar(s, once_per_step([op for g in groups for op in group_ops(g)]))


def prefill_time(hw, model, chunks, *, weight_dtype="bf16", kv_dtype="bf16", policy="full", profile="auto",
                 beams=1, cache_ratio=1.0, recent_ratio=0.3) -> float:
    """Prefill of chunks `(new_tokens, past_tokens[, completes_prompt])` in one step."""
    return mixed_step_time(hw, model, None, chunks, weight_dtype=weight_dtype, kv_dtype=kv_dtype, policy=policy,
                           profile=profile, beams=beams, cache_ratio=cache_ratio, recent_ratio=recent_ratio)




def packed_prefill_time(hw, model, sequences: int, new_tokens: int, past_tokens: int = 0, *, weight_dtype="bf16",
                        kv_dtype="bf16", policy="full", profile="auto", completes_prompt: bool = True) -> float:
    """One prefill step of `sequences` equal chunks packed into one ragged batch (as serving engines run
    packed prefill: one varlen attention kernel for all of them, not one per sequence)."""
    s = make_setup(hw, model, policy, weight_dtype, kv_dtype, profile)
    ctx = make_ctx(s, "prefill", float(sequences), 1.0, float(new_tokens), float(past_tokens), 1.0, 0.3,
                   completes_prompt)
    return dense_time(s, float(sequences), 1.0, float(new_tokens)) + step_time_scalar(s, group_ops(ctx))
