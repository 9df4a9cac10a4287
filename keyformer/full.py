"""Full attention: nothing is evicted; the slot buffer grows (amortised) as tokens arrive."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from keyformer.base import Policy


@dataclass
class FullPolicy(Policy):
    cache_ratio: float = 1.0
    name: ClassVar[str] = "full"
    evicts: ClassVar[bool] = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.cache_ratio != 1.0:
            raise ValueError(f"the full policy keeps every token: cache_ratio must be 1.0, got {self.cache_ratio}")

    def priority(self, positions: torch.Tensor, scores: torch.Tensor | None) -> torch.Tensor:
        return positions.float()
