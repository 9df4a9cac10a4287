"""H2O (Zhang et al.; FMInference/H2O real-drop `H2OKVCache_LayerWise`): heavy hitters by accumulated
attention (column sums of the softmax over all queries, prompt and every decode step) plus a recent window."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from keyformer.base import Policy


@dataclass
class H2OPolicy(Policy):
    name: ClassVar[str] = "h2o"
    needs_scores: ClassVar[bool] = True
    score_flops_per_element: ClassVar[int] = 1  # the accumulation (the softmax is the model's own)

    def score_increment(self, logits: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
        return probs

    def priority(self, positions: torch.Tensor, scores: torch.Tensor | None) -> torch.Tensor:
        return scores
