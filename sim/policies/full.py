"""Full attention: no eviction, the cache grows by one token per decode step (n + s)."""
from __future__ import annotations

from dataclasses import dataclass

from sim.policies.base import SimPolicy


@dataclass(frozen=True)
class FullPolicy(SimPolicy):
    name = "full"
    evicts = False
