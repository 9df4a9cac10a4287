"""PyramidKV (keyformer/pyramidkv.py): layer budgets decreasing linearly with depth (the released code's
schedule, beta = 20), mean over layers k, H2O's selection within a layer. The engine's length is the mean
over layers per KV head, which is k (kv_tokens is H2O's); `formula_lengths` gives the per-layer schedule
(the heads of a layer hold the same number, so ragged and padded kernels agree). The schedule depends only
on n, k, w and the layer count: a trace of it records the schedule (tests/sim/test_adaptive_policies.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from kvcommon.score_costs import SCORE_FLOPS_PER_ELEMENT
from sim.policies.adaptive import AdaptivePolicy

BETA = 20.0


def pyramid_budgets(k, w, ceiling, n_layers: int, beta: float = BETA) -> np.ndarray:
    """(n_layers,) per-layer budgets (keyformer.pyramidkv.pyramid_budgets in numpy): the part above the
    window from 2e - floor(e / beta) at the first layer to floor(e / beta) at the last (e = k - w), flattened
    so the first layer holds at most `ceiling` (the prompt), rounded by largest remainders to sum L * k."""
    k, w, ceiling = float(k), float(w), float(ceiling)
    extra = k - w
    if n_layers == 1:
        return np.array([k])
    top = np.floor(extra / beta)
    bottom = min(2 * extra - top, ceiling - w)
    top = 2 * extra - bottom
    depth = np.arange(n_layers) / (n_layers - 1)
    exact = bottom + (top - bottom) * depth
    base = np.floor(exact + 1e-9)
    missing = max(int(round(extra * n_layers - base.sum())), 0)
    order = np.argsort(-(exact - base) + depth * 1e-6, kind="stable")
    bump = np.zeros(n_layers)
    bump[order[:missing]] = 1.0
    return w + base + bump


@dataclass(frozen=True)
class PyramidKVPolicy(AdaptivePolicy):
    name = "pyramidkv"
    score_flops = float(SCORE_FLOPS_PER_ELEMENT["pyramidkv"])
    beta: ClassVar[float] = BETA
    # kvsim (keyformer/pyramidkv.py + base._evict_by_mask): H2O's score (2 kernels, ~4 passes); the layer
    #   budgets on the host; the selection: two where, sort, compare x2, scatter, or, two masked_fill, any,
    #   argmax: ~11 kernels, ~14 passes over rows x kv heads x slots (the sort ~4).
    eager_paths = {"kvsim": dict(score_launches=2, score_passes=4, step_launches=0, step_passes=0,
                                 evict_launches=11, evict_passes=14)}

    def layer_budgets(self, k, w, prompt, n_layers: int) -> np.ndarray:
        return pyramid_budgets(k, w, max(float(prompt), float(k)), n_layers, self.beta)
