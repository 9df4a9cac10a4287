"""Mass (adaptive per-head budget): each KV head keeps the smallest set of tokens whose accumulated attention
score (H2O's: column sums of the softmax over the prompt and every decode step) covers a fraction `mass` of
the score held by that head, capped at the budget k and never fewer than the recent window.

The recent window counts first (it is kept anyway); the other tokens enter by descending score until the
held share reaches `mass`. Heads whose attention is concentrated keep few tokens, diffuse ones up to k, so
lengths vary per layer, head and step (the trace records them: kv.parquet's kv_len per head). A token
once evicted is gone: the share is of what the head still holds, newcomer included. mass = 1 keeps k."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from keyformer.base import Policy
from kvcommon.score_costs import SCORE_FLOPS_PER_ELEMENT


@dataclass
class MassPolicy(Policy):
    mass: float = 0.9  # share of the held accumulated score to cover
    name: ClassVar[str] = "mass"
    needs_scores: ClassVar[bool] = True
    variable_lengths: ClassVar[bool] = True
    score_flops_per_element: ClassVar[int] = SCORE_FLOPS_PER_ELEMENT["mass"]  # counted in kvcommon.score_costs

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 < self.mass <= 1.0:
            raise ValueError(f"mass must be in (0, 1], got {self.mass}")

    def score_increment(self, logits: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
        return probs

    def priority(self, positions: torch.Tensor, scores: torch.Tensor | None) -> torch.Tensor:
        return scores

    def keep_mask(self, layer, positions, scores, protected):
        return mass_keep_mask(positions, scores, protected, self.hold.to(positions.device), self.mass)


def mass_keep_mask(positions: torch.Tensor, scores: torch.Tensor, protected: torch.Tensor, cap: torch.Tensor,
                   mass: float) -> torch.Tensor:
    """(B, H, S): the window plus the fewest top-scored others covering `mass` of the held score (float64
    prefix sums), at most `cap` (B,) tokens per head."""
    valid = positions >= 0
    held = torch.where(valid, scores, 0.0).double()
    target = mass * held.sum(-1, keepdim=True)
    covered = torch.where(protected, held, 0.0).sum(-1, keepdim=True)
    candidates = valid & ~protected
    order = torch.where(candidates, held, -1.0).sort(dim=-1, descending=True, stable=True)
    values = order.values.clamp(min=0.0)
    before = values.cumsum(-1) - values  # score of the better-ranked candidates
    room = cap.view(-1, 1, 1) - protected.sum(-1, keepdim=True)
    rank = torch.arange(positions.shape[-1], device=positions.device)
    take = (covered + before < target) & (rank < room) & (order.values >= 0.0)
    return protected | torch.zeros_like(take).scatter_(-1, order.indices, take)
