"""Policies that rank the kept tokens by an accumulated attention score (H2O, Keyformer): the score
state, its update every decode step and the prompt's scoring, top-k selection and compaction.

`score_flops` is the policy's cost per kept score element and query head (each policy's module says
what it counts); everything else here is the same for every scored policy.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from sim.op import SCORE_BYTES, SOFTMAX_FLOPS, Op, OpContext
from sim.op import launch_count as _launch
from sim.policies.base import SimPolicy, recent_window


@dataclass(frozen=True)
class ScoredPolicy(SimPolicy):
    scored = True
    score_flops: ClassVar[float] = 0.0

    def state_bytes(self, model, rows, kv_tokens):
        """One fp32 score per kept token, KV head and layer."""
        return rows * kv_tokens * (model.n_layers * model.n_kv_heads * SCORE_BYTES)

    def decode_ops(self, ctx: OpContext) -> list[Op]:
        """Per decode step: update the accumulated score of every kept token, evict the lowest-scored one."""
        m = ctx.model
        kept = ctx.past_tokens + 1.0                           # cached tokens plus the one just appended
        elems = ctx.rows * m.n_heads * kept                    # one probability per query head and kept key
        state = ctx.rows * m.n_kv_heads * kept                 # accumulated scores live per KV head
        candidates = ctx.rows * m.n_kv_heads * (kept - recent_window(ctx.past_tokens, ctx.recent_ratio))
        if ctx.profile.score_in_attention:
            # a by-product of the attention softmax: the kernel that holds each probability (keyformer: adds
            # the noise and takes the second softmax on chip) read-modify-writes the accumulated score vector
            update = Op("score_update", True, flops=self.score_flops * elems,
                        act_bytes=2 * state * SCORE_BYTES, launches=0.0, fused_into="attn_scores")
        else:
            # the attention kernel emits the probabilities (keyformer: the raw logits) once in fp32, the
            # score kernel reads them and read-modify-writes the accumulated score vector.
            update = Op("score_update", True, flops=self.score_flops * elems,
                        act_bytes=2 * elems * SCORE_BYTES + 2 * state * SCORE_BYTES,
                        launches=_launch(ctx, "score_update"))
        return [
            update,
            # one small kernel per layer: the lowest accumulated score outside the recent window
            Op("select_evict", True, flops=candidates, act_bytes=candidates * SCORE_BYTES,
               launches=_launch(ctx, "select_evict")),
        ]

    def prefill_ops(self, ctx: OpContext) -> list[Op]:
        """After the prompt: score every prompt token, pick top-(k-w) plus the recent w, gather k of n."""
        m, ab = ctx.model, ctx.ab
        hd, h, hkv = m.head_dim, m.n_heads, m.n_kv_heads
        rows, q, past = ctx.rows, ctx.new_tokens, ctx.past_tokens
        n = past + q
        score_elems = rows * h * q * (past + (q + 1) * 0.5)
        # A flash kernel does not keep the probabilities: recompute the logits (2*hd FLOPs each) and
        # column-sum the (noisy) softmax into one score per kept token and KV head.
        # (The column sums need each row's softmax normaliser, known only once the row is done: a second
        # pass, also under the fused profile; it recomputes q @ K^T, so it is GEMM-class.)
        ops = [Op("score_update", True, flops=score_elems * (2 * hd + SOFTMAX_FLOPS + self.score_flops),
                  act_bytes=rows * q * (h + hkv) * hd * ab + rows * hkv * n * SCORE_BYTES,
                  launches=_launch(ctx, "score_update"), matmul=True)]
        if not ctx.completes_prompt:
            return ops
        k = np.minimum(self.budget(n, ctx.cache_ratio), n)   # a padded budget above n selects nothing
        return ops + selection_ops(ctx, n, k, recent_window(k, ctx.recent_ratio))


def selection_ops(ctx: OpContext, n, k, w) -> list[Op]:
    """Once the prompt is scored: top-(k - w) of the n - w candidates per KV head, then gather the k kept
    K/V (and their scores) into the cache."""
    m, kvb = ctx.model, ctx.kvb
    hd, hkv, rows = m.head_dim, m.n_kv_heads, ctx.rows
    candidates = rows * hkv * np.maximum(n - w, 1.0)
    return [
        Op("select_topk", True, flops=candidates * np.log2(np.maximum(k - w, 2.0)),
           act_bytes=candidates * SCORE_BYTES, launches=_launch(ctx, "select_topk")),
        Op("compact", True, act_bytes=2 * rows * hkv * k * SCORE_BYTES,
           kv_read_bytes=2 * rows * hkv * k * hd * kvb, kv_write_bytes=2 * rows * hkv * k * hd * kvb,
           launches=_launch(ctx, "compact")),
    ]


def last_queries_score_ops(ctx: OpContext, queries, score_flops: float) -> list[Op]:
    """Score the prompt by its last `queries` queries only (SnapKV's observation window, TOVA's current
    query): recompute their logits against all n prompt keys from the cache (GEMM-class, as above), softmax,
    and reduce into one score per prompt key and KV head. Runs with the chunk that completes the prompt."""
    m, ab, kvb = ctx.model, ctx.ab, ctx.kvb
    hd, h, hkv, rows = m.head_dim, m.n_heads, m.n_kv_heads, ctx.rows
    n = ctx.past_tokens + ctx.new_tokens
    w = np.minimum(queries, n)
    elems = rows * h * w * (n - (w - 1) * 0.5)         # causal inside the window
    return [Op("score_update", True, flops=elems * (2 * hd + SOFTMAX_FLOPS + score_flops),
               act_bytes=rows * w * h * hd * ab + rows * hkv * n * SCORE_BYTES,
               kv_read_bytes=rows * hkv * n * hd * kvb, launches=_launch(ctx, "score_update"), matmul=True)]
