"""Keyformer: key tokens by an accumulated Gumbel-regularised softmax of the logits, plus a recent window
(keyformer/keyformer.py)."""
from __future__ import annotations

from dataclasses import dataclass

from kvcommon.score_costs import SCORE_FLOPS_PER_ELEMENT
from sim.policies.scored import ScoredPolicy


@dataclass(frozen=True)
class KeyformerPolicy(ScoredPolicy):
    name = "keyformer"
    score_flops = float(SCORE_FLOPS_PER_ELEMENT["keyformer"])  # keyformer/'s figure (kvcommon.score_costs)
    # kvsim (keyformer/keyformer.py + base.py): the Gumbel noise of all layers is drawn once per step
    #   (random_, &, to, mul_, log_, neg_, log_, mul_: 8 kernels, ~15 passes over n_layers x the score
    #   tensor); per layer torch.add(noise, logits / tau) and softmax (2 kernels, ~6 passes), the GQA group
    #   sum (1 kernel when heads share a KV head) and += into the slot scores (1). Eviction
    #   (base._evict_one): compare with the window floor, masked_fill(inf), min, two scatter_ (5 kernels,
    #   ~7 passes over rows x kv heads x slots).
    # hf (official MPT attention.py, shared/docs/keyformer-paper.md §1.3-1.4, §4.4): copy.deepcopy of the
    #   logits (1 kernel, 2 passes); F.gumbel_softmax = empty_like().exponential_().log().neg(), add, divide
    #   by tau, softmax (6 kernels, ~10 passes); sum over batch/beams and query rows (2 kernels, 2 passes);
    #   accumulate into the score (2 kernels, 3 passes): 11 kernels, ~17 passes. Selection: topk,
    #   discard-mask rebuild and AND, masked_fill of the logits (~6 kernels, ~4 passes over the scores).
    # score_*: per layer; step_*: once per decode step for all layers; evict_*: per layer.
    eager_paths = {
        "kvsim": dict(score_launches=4, score_passes=8, step_launches=8, step_passes=15,
                      evict_launches=5, evict_passes=7),
        "hf": dict(score_launches=11, score_passes=17, step_launches=0, step_passes=0,
                   evict_launches=6, evict_passes=4),
    }
