"""Window attention (Child et al.): only the k most recent tokens are kept; the oldest leaves each step."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from keyformer.base import Policy


@dataclass
class WindowPolicy(Policy):
    recent_ratio: float = 1.0
    name: ClassVar[str] = "window"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.recent_ratio != 1.0:
            raise ValueError(f"window attention keeps only recent tokens: recent_ratio must be 1.0, "
                             f"got {self.recent_ratio}")

    def priority(self, positions: torch.Tensor, scores: torch.Tensor | None) -> torch.Tensor:
        return positions.float()  # oldest first
