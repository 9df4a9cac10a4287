"""How many tokens each KV head holds, per policy (vectorised: every argument may be an array).

Conventions (the same as keyformer/ and the Keyformer paper, §3.1/§3.4):
- the prefill runs full attention over all n prompt tokens and materialises n tokens of KV;
- an evicting policy then keeps a budget k = floor(p * n) tokens (p = cache ratio, a fraction of the
  real prompt length), of which the recent window is w = floor(r * k);
- decode step s (s = 0 for the first step after the prefill) reads the cached tokens, appends its own
  token and, for evicting policies, evicts one so the cache returns to k. Full attention grows: n + s.
"""
from __future__ import annotations

import numpy as np

POLICIES = ("full", "window", "streaming", "h2o", "keyformer")
EVICTING = ("window", "streaming", "h2o", "keyformer")
SCORED = ("h2o", "keyformer")          # policies that keep an accumulated attention score per token
STREAMING_SINKS = 4                    # StreamingLLM's attention sinks (start_size=4)


def check_policy(policy: str) -> str:
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; expected one of {', '.join(POLICIES)}")
    return policy


def budget(prompt, cache_ratio):
    """k = floor(p * n), at least one token."""
    return np.maximum(np.floor(np.asarray(cache_ratio, float) * np.asarray(prompt, float)), 1.0)


def recent_window(k, recent_ratio):
    """w = floor(r * k): the part of the budget reserved for the most recent tokens."""
    return np.floor(np.asarray(recent_ratio, float) * np.asarray(k, float))


def kv_tokens(policy: str, prompt, step, cache_ratio):
    """Cached tokens per KV head read at decode step `step` (0-based, before appending the new token)."""
    check_policy(policy)
    grown = np.asarray(prompt, float) + np.asarray(step, float)
    if policy == "full":
        return grown
    return np.minimum(grown, budget(prompt, cache_ratio))


def peak_kv_tokens(policy: str, prompt, gen, cache_ratio):
    """Most tokens per KV head held at once over a request: the prefill holds all n prompt tokens;
    full attention ends at n + gen (the whole sequence is reserved), evicting policies at k + 1
    (the appended token before its eviction)."""
    check_policy(policy)
    n = np.asarray(prompt, float)
    if policy == "full":
        return n + np.asarray(gen, float)
    return np.maximum(n, budget(prompt, cache_ratio) + 1.0)
