"""How many tokens each KV head holds, per policy (vectorised: every argument may be an array).

Conventions (the same as keyformer/ and the Keyformer paper, §3.1/§3.4):
- the prefill runs full attention over all n prompt tokens and materialises n tokens of KV;
- an evicting policy then keeps a budget k = floor(p * n) tokens (p = cache ratio, a fraction of the
  real prompt length), of which the recent window is w = floor(r * k);
- decode step s (s = 0 for the first step after the prefill) reads the cached tokens, appends its own
  token and, for evicting policies, evicts one so the cache returns to k. Full attention grows: n + s.
- sliding-window layers (a `model` with `sliding_layers`, e.g. Mistral-7B v0.1: a 4096 window on every
  layer) keep at most the window: min(tokens, window) there, the policy's count elsewhere; the functions
  that take a `model` return the mean over layers (what the engine's per-head KV length means).
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


def windowed(model, tokens):
    """Mean over layers of the tokens per KV head when every layer would hold `tokens`: sliding-window
    layers hold min(tokens, window). `tokens` unchanged for a model without such layers (or None)."""
    n_windowed = getattr(model, "windowed_layers", 0) if model is not None else 0
    if not n_windowed:
        return tokens
    share = n_windowed / model.n_layers
    t = np.asarray(tokens, float)
    return (1.0 - share) * t + share * np.minimum(t, float(model.sliding_window))


def windowed_per_layer(model, per_layer):
    """A (..., n_layers) array of tokens per KV head with each sliding-window layer capped at the window
    (e.g. a trace's kv_override mapped onto a model with sliding-window layers)."""
    arr = np.asarray(per_layer, float)
    if model is None or not getattr(model, "windowed_layers", 0) or arr.ndim < 1 or arr.shape[-1] != model.n_layers:
        return arr
    arr = arr.copy()
    layers = list(model.sliding_layers)
    arr[..., layers] = np.minimum(arr[..., layers], float(model.sliding_window))
    return arr


def kv_tokens(policy: str, prompt, step, cache_ratio, model=None):
    """Cached tokens per KV head read at decode step `step` (0-based, before appending the new token);
    with `model`, the mean over its layers (sliding-window layers hold at most the window)."""
    check_policy(policy)
    grown = np.asarray(prompt, float) + np.asarray(step, float)
    if policy == "full":
        return windowed(model, grown)
    return windowed(model, np.minimum(grown, budget(prompt, cache_ratio)))


def peak_kv_tokens(policy: str, prompt, gen, cache_ratio, model=None):
    """Most tokens per KV head held at once over a request: the prefill holds all n prompt tokens;
    full attention ends at n + gen (the whole sequence is reserved), evicting policies at k + 1
    (the appended token before its eviction). With `model`: the mean over its layers, sliding-window
    layers capped at the window."""
    check_policy(policy)
    n = np.asarray(prompt, float)
    if policy == "full":
        return windowed(model, n + np.asarray(gen, float))
    return windowed(model, np.maximum(n, budget(prompt, cache_ratio) + 1.0))


def steady_kv_tokens(policy: str, prompt, gen, cache_ratio, model=None):
    """Tokens per KV head a decoding request holds in the steady state of continuous batching, averaged
    over its life: full attention the prompt plus what it has generated so far, n + gen/2 (the mean over
    its gen - 1 decode steps of n + t + 1, the step's own token included); evicting policies k + 1.
    With `model`: the mean over its layers, sliding-window layers capped at the window."""
    check_policy(policy)
    n = np.asarray(prompt, float)
    if policy == "full":
        return windowed(model, n + 0.5 * np.asarray(gen, float))
    return windowed(model, np.minimum(n, budget(prompt, cache_ratio)) + 1.0)
