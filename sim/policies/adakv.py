"""Ada-KV (keyformer/adakv.py): a layer's n_kv_heads x k tokens are shared by its heads by accumulated score
(top scores over the layer's heads jointly, each head at least its recent window). The layer's total stays
n_kv_heads x k, so under a ragged kernel its cost is the formula's (k per head on average); a padded kernel
(and buffer) pays the fullest head, which only a trace knows: without one, both are k."""
from __future__ import annotations

from dataclasses import dataclass

from kvcommon.score_costs import SCORE_FLOPS_PER_ELEMENT
from sim.policies.adaptive import AdaptivePolicy


@dataclass(frozen=True)
class AdaKVPolicy(AdaptivePolicy):
    name = "adakv"
    score_flops = float(SCORE_FLOPS_PER_ELEMENT["adakv"])
    sorts = True
    # kvsim (keyformer/adakv.py + base._evict_by_mask): H2O's score (2 kernels, ~4 passes); the selection:
    #   where, sum, reshape, sort over the layer's heads, compare x2, scatter, or, two masked_fill, any,
    #   argmax: ~12 kernels, ~16 passes over rows x kv heads x slots (the sort ~4).
    eager_paths = {"kvsim": dict(score_launches=2, score_passes=4, step_launches=0, step_passes=0,
                                 evict_launches=12, evict_passes=16)}
