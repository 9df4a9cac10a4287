"""The simulator's policies, one frozen dataclass per file on sim.policies.base.SimPolicy (mirroring
keyformer/'s one class per policy): `get(name)` returns the policy object, `NAMES` lists them in order.

The engine, capacity and profiles ask the object (kv lengths, peak, state bytes, its own operators, its
eager score path); sim.kvlen keeps the string-keyed functions for callers that hold a name.
SnapKV (a one-shot prompt compression, then the cache grows) and TOVA (ranks by the current query only,
no recent window, no accumulated state) are modelled too, and the adaptive budgets mass, pyramidkv and
adakv (sim.policies.adaptive: lengths from traces, ragged or padded attention kernels): the same ten
policies as keyformer/.

`get` also takes a variant, `keyformer(budget_base=padded)` or `h2o:recent_ratio=0.2` (sim.policies.variants:
the keys are keyformer/'s, the simulator's treatment of each is documented there): the base policy's object
carrying the variant's parameters, which only `budget_base` and `pad_length` change (SimPolicy.budget).
"""
from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

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
from sim.policies.variants import read_variant
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
    """The policy object named `name`, or of a variant's label (a ValueError of one line otherwise: the
    policy names, or the variant's valid keys and values)."""
    policy = _POLICIES.get(name) if isinstance(name, str) else None
    if policy is not None:
        return policy
    if not isinstance(name, str):
        raise ValueError(f"unknown policy {name!r}; expected one of {', '.join(NAMES)}")
    return _variant(name)


@lru_cache(maxsize=256)
def _variant(text: str) -> SimPolicy:
    variant = read_variant(text, NAMES)
    base = _POLICIES[variant.name]
    return replace(base, variant_params=tuple(sorted(variant.params.items()))) if variant.params else base


def label(text: str) -> str:
    """The stored label of a policy or variant as typed (`h2o:recent_ratio=0.20` -> `h2o(recent_ratio=0.2)`),
    checked: the policy string the simulator, its tables and trace folders share."""
    return read_variant(text, NAMES).label


__all__ = ["NAMES", "EVICTING", "SCORED", "ADAPTIVE", "ATTN_KERNELS", "get", "label", "budget", "recent_window", "SimPolicy", "ScoredPolicy",
           "FullPolicy", "WindowPolicy", "StreamingPolicy", "H2OPolicy", "KeyformerPolicy", "SnapKVPolicy",
           "TOVAPolicy", "AdaptivePolicy", "MassPolicy", "PyramidKVPolicy", "AdaKVPolicy"]
