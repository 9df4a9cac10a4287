"""Ada-KV (Feng et al. 2024, "Ada-KV: Optimizing KV Cache Eviction by Adaptive Budget Allocation";
FFY0/AdaKV `AdaptiveSnapKVCluster`): a layer's budget, n_kv_heads x k tokens, is shared by its KV heads, so
heads that attend sharply give up budget to heads that attend broadly; lengths vary per head.

`scoring="reference"` (default), the released Ada-SnapKV rule: the prompt is compressed once, then the cache
grows. The last `window` prompt queries (32 in the released scripts) vote as in SnapKV (their attention onto
the prefix before the window, max-pooled with kernel 7 over the prefix only). With B = k - window per head:
if the prefix is shorter than B nothing is compressed; otherwise the layer's top H x B prefix scores over
all heads jointly give head h a count c_h, and head h keeps its own top round(c_h (1 - alpha) + int(alpha B))
prefix tokens plus the window (`floor_alpha` = alpha = 0.5: every head keeps at least half of B).

`scoring="h2o"` (kvsim's earlier adakv, an H2O-allocation variant): H2O's accumulated scores with the recent
window w = r k; every token outside the windows competes with those of the other heads of the layer; the
layer keeps the top n_kv_heads x k - (the windows) jointly, each head what it wins plus its own window, at the
prompt and after every decode step (n_kv_heads tokens leave the layer jointly, any head may lose them); no
per-head floor beyond the window. A head may win more than k tokens: the slot buffer is padded to the layer's
fullest head and grows when a head fills it (kv_bytes counts the padding). Trace folders captured before
this split (no `scoring` in their manifest's parameters) hold this variant under the label `adakv`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from keyformer.pyramidkv import WindowVoteScoring
from keyformer.scoring import top_by_rank
from kvcommon.score_costs import SCORE_FLOPS_PER_ELEMENT


@dataclass
class AdaKVPolicy(WindowVoteScoring):
    window: int = 32  # reference: observation window (the released scripts: 32)
    floor_alpha: float = 0.5  # reference: share of B every head keeps whatever the others' scores
    name: ClassVar[str] = "adakv"
    needs_scores: ClassVar[bool] = True
    variable_lengths: ClassVar[bool] = True
    score_flops_per_element: ClassVar[int] = SCORE_FLOPS_PER_ELEMENT["adakv"]  # counted in kvcommon.score_costs

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.floor_alpha <= 1.0:
            raise ValueError(f"floor_alpha must be in [0, 1], got {self.floor_alpha}")

    def priority(self, positions: torch.Tensor, scores: torch.Tensor | None) -> torch.Tensor:
        return scores

    def slot_capacity(self, layer_idx: int) -> int:
        if self.scoring == "reference":  # the most one head can keep at the prompt; the buffer grows after
            return int(self.prompt_lengths.max())
        return super().slot_capacity(layer_idx)

    def keep_mask(self, layer, positions, scores, protected):
        if self.scoring == "reference":
            return self._reference_keep(positions, scores, protected)
        batch, heads, slots = positions.shape
        candidates = (positions >= 0) & ~protected
        room = heads * self.hold.to(positions.device) - protected.sum(dim=(1, 2))  # (B,) the layer's share left
        ranking = torch.where(candidates, scores, -torch.inf).reshape(batch, heads * slots)
        won = top_by_rank(ranking, room.clamp(min=0)).view(batch, heads, slots)
        return protected | won

    def _reference_keep(self, positions, scores, protected):
        """The prompt: joint top H x B over the layer's heads sets each head's count, floored at alpha B."""
        batch, heads, slots = positions.shape
        device = positions.device
        prefix = (positions >= 0) & ~protected
        per_head = (self.budget - self.recent).clamp(min=0).to(device)  # B per sequence
        fits = prefix.sum(dim=(1, 2)) <= heads * per_head  # (B,) prefix no longer than B per head: keep all
        ranking = torch.where(prefix, scores, -torch.inf)
        won = top_by_rank(ranking.reshape(batch, heads * slots), heads * per_head).view(batch, heads, slots)
        floor = torch.floor(per_head.double() * self.floor_alpha)  # int(B * alpha)
        counts = torch.round(won.sum(-1).double() * (1.0 - self.floor_alpha) + floor.view(-1, 1)).long()
        keep = top_by_rank(ranking, counts)
        return protected | torch.where(fits.view(-1, 1, 1), prefix, keep)
