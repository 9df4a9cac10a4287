"""TOVA (Oren et al. 2024; schwartz-lab-NLP/TOVA `TOVACache`): after every attention call over more than k
tokens, keep the k with the highest attention from the *current* (last) query, averaged over all heads of
the layer, so the same token leaves every KV head of a layer. No recent window and no sinks; the score is
not accumulated: each step ranks by its own query only (shared/docs/transformers-kv-notes.md §3.4)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from keyformer.base import Policy
from kvcommon.score_costs import SCORE_FLOPS_PER_ELEMENT


@dataclass
class TOVAPolicy(Policy):
    recent_ratio: float = 0.0  # TOVA protects nothing; the newest token usually survives on its own attention
    name: ClassVar[str] = "tova"
    needs_scores: ClassVar[bool] = True
    accumulates: ClassVar[bool] = False
    score_flops_per_element: ClassVar[int] = SCORE_FLOPS_PER_ELEMENT["tova"]  # counted in kvcommon.score_costs

    def score_increment(self, logits: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
        batch, kv_heads, _, _, slots = probs.shape
        last = probs[:, :, :, -1:, :].mean(dim=(1, 2), keepdim=True)  # (B, 1, 1, 1, S): all heads of the layer
        return last.expand(batch, kv_heads, 1, 1, slots).contiguous()

    def priority(self, positions: torch.Tensor, scores: torch.Tensor | None) -> torch.Tensor:
        return scores
