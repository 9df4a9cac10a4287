"""SnapKV (Li et al. 2024; FasterDecoding/SnapKV `SnapKVCluster`): a prompt-time selection only. The last
`window` prompt queries (the observation window) vote: their attention onto each earlier prompt token is
summed, smoothed along the prefix (the keys before the window) with a 1-D pool (`kernel`, avg or max), and
the top k - window prefix tokens are kept with the window itself. Decoding then appends every new token
without eviction, so the cache grows from k to k + t (shared/docs/transformers-kv-notes.md §3.3).
`window_votes` and `pool_prefix` are shared with the references' PyramidKV and AdaKV (pyramidkv.py, adakv.py)."""
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
        check_window_kernel(self)
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, got {self.pooling!r}")

    def recent_tokens(self, budget: torch.Tensor) -> torch.Tensor:
        return torch.clamp(budget, max=self.window)

    def score_increment(self, logits: torch.Tensor, probs: torch.Tensor) -> torch.Tensor | None:
        return window_votes(probs, self.prompt_positions, self.prompt_lengths, self.window)

    def finalize_prompt_scores(self, scores: torch.Tensor) -> torch.Tensor:
        """Pool along the key axis over the prefix only, as the references do (they pool the votes of the
        keys before the observation window, `[..., :-window]`, zero-padded by kernel // 2): the window's own
        votes are zeroed first, so a prefix token next to the window is not lifted by them (the votes are >= 0,
        so a zero acts as the boundary's padding for max pooling too; left pads score 0 already)."""
        return pool_prefix(scores, self.prompt_positions, self.prompt_lengths - self.window, self.kernel,
                           self.pooling)

    def priority(self, positions: torch.Tensor, scores: torch.Tensor | None) -> torch.Tensor:
        return scores


def check_window_kernel(policy) -> None:
    """The observation window and pooling kernel (snapkv, and the references' pyramidkv and adakv)."""
    if policy.window < 1:
        raise ValueError(f"window must be >= 1, got {policy.window}")
    if policy.kernel < 1 or policy.kernel % 2 == 0:
        raise ValueError(f"kernel must be an odd number >= 1, got {policy.kernel}")


def window_votes(probs: torch.Tensor, prompt_positions: torch.Tensor, prompt_lengths: torch.Tensor,
                 window: int) -> torch.Tensor | None:
    """The observation window's rows of the prompt's attention (the last `window` real queries of each
    sequence), the others zeroed; None at decode steps (nothing is scored after the prompt)."""
    if probs.shape[3] == 1:
        return None
    rows = prompt_positions.to(probs.device)  # (B, n) original positions, -1 = padding
    votes = rows >= (prompt_lengths.to(probs.device) - window).view(-1, 1)
    return probs * (votes & (rows >= 0))[:, None, None, :, None]


def pool_prefix(scores: torch.Tensor, prompt_positions: torch.Tensor, prefix_lengths: torch.Tensor, kernel: int,
                pooling: str) -> torch.Tensor:
    """(B, H, n) votes pooled along the keys of each sequence's prefix [0, prefix_length) only (zero padding,
    as avg_pool1d(count_include_pad) / max_pool1d with padding kernel // 2); the rest comes back as 0."""
    batch, heads, n = scores.shape
    positions = prompt_positions.to(scores.device).view(batch, 1, n)
    prefix = (positions >= 0) & (positions < prefix_lengths.to(scores.device).view(batch, 1, 1))
    scores = torch.where(prefix, scores, 0.0)
    flat = scores.reshape(batch * heads, 1, n)
    pad = kernel // 2
    pooled = (F.avg_pool1d(flat, kernel, stride=1, padding=pad, count_include_pad=True)
              if pooling == "avg" else F.max_pool1d(flat, kernel, stride=1, padding=pad))
    return torch.where(prefix, pooled.view(batch, heads, n), 0.0)
