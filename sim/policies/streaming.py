"""StreamingLLM: the first `sinks` tokens (attention sinks) plus the most recent ones, k in all; eviction by
position, so its lengths and operators are the window policy's."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from sim.policies.base import SimPolicy

SINKS = 4                    # StreamingLLM's attention sinks (start_size=4)


@dataclass(frozen=True)
class StreamingPolicy(SimPolicy):
    name = "streaming"
    sinks: ClassVar[int] = SINKS
