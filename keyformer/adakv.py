"""Ada-KV (Feng et al. 2024, "Ada-KV: Optimizing KV Cache Eviction by Adaptive Budget Allocation";
FFY0/AdaKV): a layer's budget, n_kv_heads x k tokens, is shared by its KV heads. Every token outside the
recent windows competes with those of the other heads of the layer on its accumulated attention score
(H2O's); the layer keeps the top n_kv_heads x k - (the windows) of them jointly, and each head holds what it
wins plus its own window. Heads that attend sharply give up budget to heads that attend broadly, so lengths
vary per head and step while the layer's total stays n_kv_heads x k.

Departures from the released code: its scores are SnapKV's observation-window votes at the prompt, then the
cache grows; here H2O's accumulated scores select at the prompt and every decode step evicts (n_kv_heads
tokens leave the layer jointly, any head may lose them). Its safeguard (each head keeps at least a share
alpha of k) is the recent window here. A head may win more than k tokens: the slot buffer is padded to the
layer's fullest head and grows when a head fills it (kv_bytes counts the padding)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from keyformer.base import Policy
from keyformer.scoring import top_by_rank
from kvcommon.score_costs import SCORE_FLOPS_PER_ELEMENT


@dataclass
class AdaKVPolicy(Policy):
    name: ClassVar[str] = "adakv"
    needs_scores: ClassVar[bool] = True
    variable_lengths: ClassVar[bool] = True
    score_flops_per_element: ClassVar[int] = SCORE_FLOPS_PER_ELEMENT["adakv"]  # counted in kvcommon.score_costs

    def score_increment(self, logits: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
        return probs

    def priority(self, positions: torch.Tensor, scores: torch.Tensor | None) -> torch.Tensor:
        return scores

    def keep_mask(self, layer, positions, scores, protected):
        batch, heads, slots = positions.shape
        candidates = (positions >= 0) & ~protected
        room = heads * self.hold.to(positions.device) - protected.sum(dim=(1, 2))  # (B,) the layer's share left
        ranking = torch.where(candidates, scores, -torch.inf).reshape(batch, heads * slots)
        won = top_by_rank(ranking, room.clamp(min=0)).view(batch, heads, slots)
        return protected | won
