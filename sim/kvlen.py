"""How many tokens each KV head holds, by policy name (vectorised: every argument may be an array).

The rules are the policy objects' (sim.policies: budget k = floor(p n), recent window w = floor(r k),
kv_tokens, peak and steady-state lengths); this module keeps the string-keyed entries for callers that
hold a policy name (the DES, the CLIs), and the sliding-window helpers of sim.models.
"""
from __future__ import annotations

from sim import policies
from sim.models import windowed, windowed_per_layer
from sim.policies import budget, recent_window
from sim.policies.streaming import SINKS as STREAMING_SINKS

POLICIES = policies.NAMES
EVICTING = policies.EVICTING
SCORED = policies.SCORED          # policies that keep an accumulated attention score per token


def check_policy(policy: str) -> str:
    policies.get(policy)
    return policy


def kv_tokens(policy: str, prompt, step, cache_ratio, model=None):
    """Cached tokens per KV head read at decode step `step` (0-based, before appending the new token);
    with `model`, the mean over its layers (sliding-window layers hold at most the window)."""
    return policies.get(policy).kv_tokens(prompt, step, cache_ratio, model=model)


def peak_kv_tokens(policy: str, prompt, gen, cache_ratio, model=None):
    """Most tokens per KV head held at once over a request (sim.policies.SimPolicy.peak_kv_tokens)."""
    return policies.get(policy).peak_kv_tokens(prompt, gen, cache_ratio, model=model)


def steady_kv_tokens(policy: str, prompt, gen, cache_ratio, model=None):
    """Tokens per KV head a decoding request holds in the steady state of continuous batching
    (sim.policies.SimPolicy.steady_kv_tokens)."""
    return policies.get(policy).steady_kv_tokens(prompt, gen, cache_ratio, model=model)


__all__ = ["POLICIES", "EVICTING", "SCORED", "STREAMING_SINKS", "check_policy", "budget", "recent_window",
           "windowed", "windowed_per_layer", "kv_tokens", "peak_kv_tokens", "steady_kv_tokens"]
