"""H2O (Zhang et al.; FMInference/H2O real-drop `H2OKVCache_LayerWise`): heavy hitters by accumulated
attention (column sums of the softmax over all queries, prompt and every decode step) plus a recent window.

Recent split: the default recent_ratio=0.3 (w = 0.3 k) is Keyformer's (its scripts' `--recent 30`), so the two
differ only in the score. H2O's own code splits the budget in half (heavy_ratio = recent_ratio = budget/2):
pass recent_ratio=0.5 for that. Results name the split they used (the trace manifests record it)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from keyformer.base import Policy
from kvcommon.score_costs import SCORE_FLOPS_PER_ELEMENT


@dataclass
class H2OPolicy(Policy):
    name: ClassVar[str] = "h2o"
    needs_scores: ClassVar[bool] = True
    score_flops_per_element: ClassVar[int] = SCORE_FLOPS_PER_ELEMENT["h2o"]  # counted in kvcommon.score_costs

    def score_increment(self, logits: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
        return probs

    def priority(self, positions: torch.Tensor, scores: torch.Tensor | None) -> torch.Tensor:
        return scores
