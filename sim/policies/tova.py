"""TOVA (keyformer/tova.py): keep the k tokens the current query attends to most, averaged over all heads of
the layer; no recent window, no accumulation: each decode step ranks by its own query and evicts one."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvcommon.score_costs import SCORE_FLOPS_PER_ELEMENT
from sim.op import SCORE_BYTES, Op, OpContext
from sim.op import launch_count as _launch
from sim.policies.scored import ScoredPolicy, last_queries_score_ops, selection_ops


@dataclass(frozen=True)
class TOVAPolicy(ScoredPolicy):
    name = "tova"
    score_flops = float(SCORE_FLOPS_PER_ELEMENT["tova"])
    # kvsim (keyformer/tova.py + base.py): the last query row's mean over heads (1 kernel, one pass over the
    #   probabilities) and its expand to every KV head (1 kernel, one pass over the slots); the eviction
    #   (base._evict_one): 5 kernels, ~7 passes over rows x kv heads x slots. The paper's hf stack has no TOVA.
    eager_paths = {"kvsim": dict(score_launches=2, score_passes=2, step_launches=0, step_passes=0,
                                 evict_launches=5, evict_passes=7)}

    def state_bytes(self, model, rows, kv_tokens):
        """One fp32 score per kept token of the layer being decoded (shared by its heads, not kept across
        steps): a transient vector, not a cache."""
        return rows * kv_tokens * SCORE_BYTES

    def decode_ops(self, ctx: OpContext) -> list[Op]:
        """Per decode step and layer: the current query's probabilities averaged over the heads (under a
        fused kernel a by-product of the softmax), then the argmin over every kept token (no window)."""
        m = ctx.model
        kept = ctx.past_tokens + 1.0
        elems = ctx.rows * m.n_heads * kept
        scores = ctx.rows * kept
        if ctx.profile.score_in_attention:
            rank = Op("score_update", True, flops=self.score_flops * elems, act_bytes=scores * SCORE_BYTES,
                      launches=0.0, fused_into="attn_scores")
        else:
            rank = Op("score_update", True, flops=self.score_flops * elems,
                      act_bytes=elems * SCORE_BYTES + scores * SCORE_BYTES, launches=_launch(ctx, "score_update"))
        return [rank, Op("select_evict", True, flops=scores, act_bytes=scores * SCORE_BYTES,
                         launches=_launch(ctx, "select_evict"))]

    def prefill_ops(self, ctx: OpContext) -> list[Op]:
        """After the prompt: rank it by the last query's attention and keep the top k (no window)."""
        if not ctx.completes_prompt:
            return []
        n = ctx.past_tokens + ctx.new_tokens
        return [*last_queries_score_ops(ctx, 1.0, self.score_flops),
                *selection_ops(ctx, n, np.minimum(self.budget(n, ctx.cache_ratio), n), 0.0)]
