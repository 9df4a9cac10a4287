"""H2O: heavy hitters by the accumulated attention probability, plus a recent window (keyformer/h2o.py)."""
from __future__ import annotations

from dataclasses import dataclass

from kvcommon.score_costs import SCORE_FLOPS_PER_ELEMENT
from sim.policies.scored import ScoredPolicy


@dataclass(frozen=True)
class H2OPolicy(ScoredPolicy):
    name = "h2o"
    score_flops = float(SCORE_FLOPS_PER_ELEMENT["h2o"])       # keyformer/'s figure (kvcommon.score_costs)
    # kvsim (keyformer/h2o.py): the model's probabilities are the score: group sum and += (2 kernels); the
    #   eviction of base._evict_one (compare with the window floor, masked_fill(inf), min, two scatter_:
    #   5 kernels, ~7 passes over rows x kv heads x slots).
    # hf (the paper's H2O baseline: its Keyformer code without the logit adjustment, paper §4.4.3):
    #   softmax of the raw logits (1, ~3 passes), the two sums and the accumulation: 5 kernels, ~8 passes;
    #   selection: topk, discard-mask rebuild and AND, masked_fill of the logits (~6 kernels, ~4 passes).
    # score_*: per layer; step_*: once per decode step for all layers; evict_*: per layer.
    eager_paths = {
        "kvsim": dict(score_launches=2, score_passes=4, step_launches=0, step_passes=0,
                      evict_launches=5, evict_passes=7),
        "hf": dict(score_launches=5, score_passes=8, step_launches=0, step_passes=0,
                   evict_launches=6, evict_passes=4),
    }
