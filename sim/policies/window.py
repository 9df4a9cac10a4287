"""Window attention: keep the k most recent tokens (eviction by position: no operators of its own)."""
from __future__ import annotations

from dataclasses import dataclass

from sim.policies.base import SimPolicy


@dataclass(frozen=True)
class WindowPolicy(SimPolicy):
    name = "window"
