"""SnapKV (Li et al. 2024; FasterDecoding/SnapKV `SnapKVCluster`): a prompt-time selection only. The last
`window` prompt queries (the observation window) vote: their attention onto each earlier prompt token is
summed, smoothed along the sequence with a 1-D pool (`kernel`, avg or max), and the top k - window tokens
are kept with the window itself. Decoding then appends every new token without eviction, so the cache grows
from k to k + t (shared/docs/transformers-kv-notes.md §3.3)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from keyformer.base import Policy
from kvcommon.score_costs import SCORE_FLOPS_PER_ELEMENT

POOLINGS = ("avg", "max")


@dataclass
class SnapKVPolicy(Policy):
    window: int = 32  # observation window (LongBench configs: 32)
    kernel: int = 7  # pooling kernel (LongBench configs: 7, max pooling)
    pooling: str = "max"
    recent_ratio: float = 0.0  # unused: the kept window is the observation window
    name: ClassVar[str] = "snapkv"
    needs_scores: ClassVar[bool] = True
    evicts_while_decoding: ClassVar[bool] = False
    score_flops_per_element: ClassVar[int] = SCORE_FLOPS_PER_ELEMENT["snapkv"]  # counted in kvcommon.score_costs

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")
        if self.kernel < 1 or self.kernel % 2 == 0:
            raise ValueError(f"kernel must be an odd number >= 1, got {self.kernel}")
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, got {self.pooling!r}")

    def recent_tokens(self, budget: torch.Tensor) -> torch.Tensor:
        return torch.clamp(budget, max=self.window)

    def score_increment(self, logits: torch.Tensor, probs: torch.Tensor) -> torch.Tensor | None:
        if probs.shape[3] == 1:
            return None  # decoding: nothing is scored or evicted
        # Only the observation window's rows vote: the last `window` real queries of each sequence.
        rows = self.prompt_positions.to(probs.device)  # (B, n) original positions, -1 = padding
        votes = rows >= (self.prompt_lengths.to(probs.device) - self.window).view(-1, 1)
        return probs * (votes & (rows >= 0))[:, None, None, :, None]

    def finalize_prompt_scores(self, scores: torch.Tensor) -> torch.Tensor:
        """Pool along the key axis (zero padding, as avg_pool1d / max_pool1d with padding kernel // 2)."""
        batch, heads, n = scores.shape
        flat = scores.reshape(batch * heads, 1, n)
        pad = self.kernel // 2
        pooled = (F.avg_pool1d(flat, self.kernel, stride=1, padding=pad, count_include_pad=True)
                  if self.pooling == "avg" else F.max_pool1d(flat, self.kernel, stride=1, padding=pad))
        return pooled.view(batch, heads, n)

    def priority(self, positions: torch.Tensor, scores: torch.Tensor | None) -> torch.Tensor:
        return scores
