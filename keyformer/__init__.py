"""KV-cache policies that physically evict, on Hugging Face causal LMs (transformers 5.17 to 5.24).

    policy = keyformer.make_policy("keyformer", cache_ratio=0.5, recent_ratio=0.3)
    with policy.apply(model):
        out = model.generate(input_ids, max_new_tokens=32)
    policy.kept_positions(0)  # (batch, kv_heads, k) original positions held by layer 0

Manual loop: keyformer.generate.prefill / decode_one_token / decode_n_tokens; timing without a prefill:
keyformer.generate.synthetic_state. See docs/ARCHITECTURE.md (keyformer section).
"""
from __future__ import annotations

from keyformer.adakv import AdaKVPolicy
from keyformer.base import Policy
from keyformer.scoring import ScoreWork, StepEvent
from keyformer.full import FullPolicy
from keyformer.h2o import H2OPolicy
from keyformer.keyformer import KeyformerPolicy
from keyformer.mass import MassPolicy
from keyformer.pyramidkv import PyramidKVPolicy
from keyformer.snapkv import SnapKVPolicy
from keyformer.streaming import StreamingPolicy
from keyformer.tova import TOVAPolicy
from keyformer.window import WindowPolicy

# The version of the selection rules a capture ran under (traces record it; docs/traces.md, "Rule versions").
# 1 (trace folders without it): pyramidkv/adakv were the H2O-allocation variants (now scoring="h2o"),
# snapkv pooled over the observation window too, Keyformer reseeded one generator per batch at every
# prefill and rounded k = floor(p n) in official mode, budget_base="padded" kept a short prompt whole until
# the cache grew to k. 2: the released code's and the references' rules (issue 26).
RULES_VERSION = 2

POLICIES: dict[str, type[Policy]] = {
    cls.name: cls for cls in (FullPolicy, WindowPolicy, StreamingPolicy, H2OPolicy, KeyformerPolicy, SnapKVPolicy,
                              TOVAPolicy, MassPolicy, PyramidKVPolicy, AdaKVPolicy)
}


def make_policy(name: str, **params) -> Policy:
    """A policy by name (`full window streaming h2o keyformer snapkv tova mass pyramidkv adakv`) with its dataclass parameters."""
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; expected one of {', '.join(POLICIES)}")
    cls = POLICIES[name]
    fields = set(cls.__dataclass_fields__)
    unknown = sorted(set(params) - fields)
    if unknown:
        raise ValueError(f"policy {name!r} has no parameter(s) {', '.join(unknown)}; "
                         f"it takes {', '.join(sorted(fields))}")
    return cls(**params)


__all__ = ["POLICIES", "RULES_VERSION", "Policy", "ScoreWork", "StepEvent", "make_policy", "FullPolicy", "WindowPolicy",
           "StreamingPolicy", "H2OPolicy", "KeyformerPolicy", "SnapKVPolicy", "TOVAPolicy",
           "MassPolicy", "PyramidKVPolicy", "AdaKVPolicy"]
