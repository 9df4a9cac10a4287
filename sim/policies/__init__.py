"""The simulator's policies, one frozen dataclass per file on sim.policies.base.SimPolicy (mirroring
keyformer/'s one class per policy): `get(name)` returns the policy object, `NAMES` lists them in order.

The engine, capacity and profiles ask the object (kv lengths, peak, state bytes, its own operators, its
eager score path); sim.kvlen keeps the string-keyed functions for callers that hold a name.
SnapKV (a one-shot prompt compression, then the cache grows) and TOVA (ranks by the current query only,
no recent window, no accumulated state) are modelled too, and the adaptive budgets mass, pyramidkv and
adakv (sim.policies.adaptive: lengths from traces, ragged or padded attention kernels): the same ten
policies as keyformer/.
"""
from __future__ import annotations

from sim.policies.adakv import AdaKVPolicy
from sim.policies.adaptive import ATTN_KERNELS, AdaptivePolicy
from sim.policies.base import SimPolicy, budget, recent_window
from sim.policies.full import FullPolicy
from sim.policies.h2o import H2OPolicy
from sim.policies.keyformer import KeyformerPolicy
from sim.policies.mass import MassPolicy
from sim.policies.pyramidkv import PyramidKVPolicy
from sim.policies.scored import ScoredPolicy
from sim.policies.snapkv import SnapKVPolicy
from sim.policies.streaming import StreamingPolicy
from sim.policies.tova import TOVAPolicy
from sim.policies.window import WindowPolicy

_POLICIES: dict[str, SimPolicy] = {cls.name: cls() for cls in (FullPolicy, WindowPolicy, StreamingPolicy,
                                                                H2OPolicy, KeyformerPolicy, SnapKVPolicy,
                                                                TOVAPolicy, MassPolicy, PyramidKVPolicy,
                                                                AdaKVPolicy)}
NAMES: tuple[str, ...] = tuple(_POLICIES)
EVICTING: tuple[str, ...] = tuple(n for n, p in _POLICIES.items() if p.evicts)
SCORED: tuple[str, ...] = tuple(n for n, p in _POLICIES.items() if p.scored)
ADAPTIVE: tuple[str, ...] = tuple(n for n, p in _POLICIES.items() if isinstance(p, AdaptivePolicy))


def get(name: str) -> SimPolicy:
    """The policy object named `name` (a ValueError listing the names otherwise)."""
    try:
        return _POLICIES[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown policy {name!r}; expected one of {', '.join(NAMES)}") from None


__all__ = ["NAMES", "EVICTING", "SCORED", "ADAPTIVE", "ATTN_KERNELS", "get", "budget", "recent_window", "SimPolicy", "ScoredPolicy",
           "FullPolicy", "WindowPolicy", "StreamingPolicy", "H2OPolicy", "KeyformerPolicy", "SnapKVPolicy",
           "TOVAPolicy", "AdaptivePolicy", "MassPolicy", "PyramidKVPolicy", "AdaKVPolicy"]
