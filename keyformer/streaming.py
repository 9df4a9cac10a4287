"""StreamingLLM (Xiao et al.; mit-han-lab/streaming-llm StartRecentKVCache): the first `n_sinks` tokens
(attention sinks) plus the k - n_sinks most recent ones. Original positions are kept by default (kvpress
StreamingLLMPress); position_mode="renumber" moves the query position next to the held tokens."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from keyformer.base import Policy

SINK_PRIORITY = 1e30  # above any position, below the recent window's +inf


@dataclass
class StreamingPolicy(Policy):
    n_sinks: int = 4
    recent_ratio: float = 1.0  # unused: the window is k - n_sinks
    name: ClassVar[str] = "streaming"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.n_sinks < 0:
            raise ValueError(f"n_sinks must be >= 0, got {self.n_sinks}")

    def recent_tokens(self, budget: torch.Tensor) -> torch.Tensor:
        return torch.clamp(budget - self.n_sinks, min=0)

    def priority(self, positions: torch.Tensor, scores: torch.Tensor | None) -> torch.Tensor:
        # Sinks outrank everything outside the window; among the rest the oldest leaves first.
        return torch.where((positions >= 0) & (positions < self.n_sinks), SINK_PRIORITY, positions.float())
