"""SnapKV (keyformer/snapkv.py): a one-shot prompt compression. The last `window` prompt queries vote with
their attention onto every prompt key, the votes are pooled along the sequence (kernel 7) and the top
k - window keys are kept with the window itself; decoding then appends every token without eviction, so the
cache grows from k to k + t."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from kvcommon.score_costs import SCORE_FLOPS_PER_ELEMENT
from sim.models import windowed
from sim.op import SCORE_BYTES, Op, OpContext
from sim.op import launch_count as _launch
from sim.policies.base import SimPolicy
from sim.policies.scored import last_queries_score_ops, selection_ops


@dataclass(frozen=True)
class SnapKVPolicy(SimPolicy):
    name = "snapkv"
    evicts = False            # the cache grows while decoding (no per-step eviction, no score state)
    window: ClassVar[int] = 32    # observation window (keyformer/snapkv.py and the LongBench configs)
    kernel: ClassVar[int] = 7     # pooling kernel
    score_flops: ClassVar[float] = float(SCORE_FLOPS_PER_ELEMENT["snapkv"])

    def _kept(self, prompt, cache_ratio):
        return np.minimum(np.asarray(prompt, float), self.budget(prompt, cache_ratio))

    def kv_tokens(self, prompt, step, cache_ratio, model=None):
        return windowed(model, self._kept(prompt, cache_ratio) + np.asarray(step, float))

    def peak_kv_tokens(self, prompt, gen, cache_ratio, model=None):
        """The prefill holds all n; decoding ends at k + gen (reserved, as full attention reserves n + gen)."""
        n = np.asarray(prompt, float)
        return windowed(model, np.maximum(n, self._kept(prompt, cache_ratio) + np.asarray(gen, float)))

    def steady_kv_tokens(self, prompt, gen, cache_ratio, model=None):
        return windowed(model, self._kept(prompt, cache_ratio) + 0.5 * np.asarray(gen, float))

    def prefill_ops(self, ctx: OpContext) -> list[Op]:
        if not ctx.completes_prompt:
            return []
        m, rows = ctx.model, ctx.rows
        n = ctx.past_tokens + ctx.new_tokens
        k = np.minimum(self.budget(n, ctx.cache_ratio), n)
        votes = rows * m.n_kv_heads * n
        return [
            *last_queries_score_ops(ctx, self.window, self.score_flops),
            # 1-D max pool of the votes along the sequence: kernel compares per vote, read and write once
            Op("score_pool", True, flops=votes * self.kernel, act_bytes=2 * votes * SCORE_BYTES,
               launches=_launch(ctx, "score_update")),
            *selection_ops(ctx, n, k, np.minimum(self.window, k)),
        ]
