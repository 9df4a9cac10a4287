"""Mass (keyformer/mass.py): each KV head keeps the fewest tokens covering a share `mass` of its accumulated
attention score, at most k, at least the recent window. It has no formula length: without a trace its
kv_tokens is the budget k (an upper bound; predictions say "formula"); with a trace, the trace's lengths
(sim.policies.adaptive: ragged or padded)."""
from __future__ import annotations

from dataclasses import dataclass

from kvcommon.score_costs import SCORE_FLOPS_PER_ELEMENT
from sim.policies.adaptive import AdaptivePolicy


@dataclass(frozen=True)
class MassPolicy(AdaptivePolicy):
    name = "mass"
    score_flops = float(SCORE_FLOPS_PER_ELEMENT["mass"])
    sorts = True
    formula_note = "mass has no formula length: these are its cap k per head (--trace for the measured lengths)"
    # kvsim (keyformer/mass.py + base._evict_by_mask): H2O's score (group sum, +=: 2 kernels, ~4 passes); the
    #   selection: where, to(double), two sums, where, sort, clamp, cumsum, sub, compare x3, scatter, or,
    #   two masked_fill, any, argmax: ~18 kernels, ~24 passes over rows x kv heads x slots (the sort ~4).
    eager_paths = {"kvsim": dict(score_launches=2, score_passes=4, step_launches=0, step_passes=0,
                                 evict_launches=18, evict_passes=24)}
