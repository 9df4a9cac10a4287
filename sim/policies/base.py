"""What a simulator policy is: the rules the engine asks of it, on one frozen dataclass per policy.

Conventions (the same as keyformer/ and the Keyformer paper, §3.1/§3.4):
- the prefill runs full attention over all n prompt tokens and materialises n tokens of KV;
- an evicting policy then keeps a budget k = floor(p * n) tokens (p = cache ratio, a fraction of the
  real prompt length), of which the recent window is w = floor(r * k) (`budget`, `recent_window`: the
  one place these are computed);
- decode step s (s = 0 for the first step after the prefill) reads the cached tokens, appends its own
  token and, for evicting policies, evicts one so the cache returns to k. Full attention grows: n + s.
- sliding-window layers (a `model` with `sliding_layers`) keep at most the window: the methods that take
  a `model` return the mean over layers (sim.models.windowed), what the engine's per-head KV length means.

A variant (sim.policies.variants) is the same object with `variant_params`; of its keys only `budget_base`
and `pad_length` enter here (`budget`): with budget_base=padded, k = floor(p max(pad_length, n)) as the
released Keyformer scripts count it, so below pad_length / p tokens the cache first grows from n towards k.

Every numeric argument may be a numpy array (one value per design point, decode step, layer): write the
rules as plain arithmetic, as sim/ops.py does.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Mapping

import numpy as np

from sim.models import windowed
from sim.op import Op, OpContext


def budget(prompt, cache_ratio):
    """k = floor(p * n), at least one token."""
    return np.maximum(np.floor(np.multiply(cache_ratio, prompt, dtype=float)), 1.0)


def recent_window(k, recent_ratio):
    """w = floor(r * k): the part of the budget reserved for the most recent tokens."""
    return np.floor(np.multiply(recent_ratio, k, dtype=float))


@dataclass(frozen=True)
class SimPolicy:
    """An evicting policy without scores by default (window-like); subclasses say what differs."""
    # a variant's own parameters, ((key, value), ...) sorted by key: () for the base policy
    variant_params: tuple = ()
    name: ClassVar[str] = ""
    # keeps a budget of k tokens while decoding (False: the cache grows by one token per step)
    evicts: ClassVar[bool] = True
    # keeps an accumulated attention score per kept token (fp32, per KV head and layer)
    scored: ClassVar[bool] = False
    # the policy's score path in eager code, per stack ("kvsim": keyformer/, "hf": the paper's MPT code):
    # kernels and passes over the fp32 score tensor (sim/profiles/eager.policy_eager_ops reads them)
    eager_paths: ClassVar[Mapping[str, Mapping[str, float]]] = {}

    def param(self, key: str, default=None):
        """A variant parameter's value (`default` when the variant does not set it)."""
        return dict(self.variant_params).get(key, default)

    def budget(self, prompt, cache_ratio):
        """k of this policy (or variant): floor(p n) of the real prompt; with budget_base=padded,
        floor(p max(pad_length, n)) (keyformer/base.py's rule; pad_length's default is the class's)."""
        if self.param("budget_base", "real") != "padded":
            return budget(prompt, cache_ratio)
        from sim.policies.variants import parameters
        pad = self.param("pad_length", parameters(self.name)["pad_length"].default)
        return budget(np.maximum(np.asarray(prompt, float), float(pad)), cache_ratio)

    # --- KV lengths ---
    def kv_tokens(self, prompt, step, cache_ratio, model=None):
        """Cached tokens per KV head read at decode step `step` (0-based, before appending the new token)."""
        grown = np.asarray(prompt, float) + np.asarray(step, float)
        if not self.evicts:
            return windowed(model, grown)
        return windowed(model, np.minimum(grown, self.budget(prompt, cache_ratio)))

    def peak_kv_tokens(self, prompt, gen, cache_ratio, model=None):
        """Most tokens per KV head held at once over a request: the prefill holds all n prompt tokens;
        a growing cache ends at n + gen (the whole sequence is reserved), an evicting one at k + 1 (the
        appended token before its eviction; at most n + gen when a padded budget is never reached)."""
        n, gen = np.asarray(prompt, float), np.asarray(gen, float)
        if not self.evicts:
            return windowed(model, n + gen)
        return windowed(model, np.maximum(n, np.minimum(self.budget(prompt, cache_ratio) + 1.0, n + gen)))

    def steady_kv_tokens(self, prompt, gen, cache_ratio, model=None):
        """Tokens per KV head a decoding request holds in the steady state of continuous batching, averaged
        over its life: a growing cache the prompt plus what it has generated so far, n + gen/2 (the mean
        over its gen - 1 decode steps of n + t + 1, the step's own token included); evicting ones k + 1
        (a padded budget above n: the growing cache's n + gen/2 until it reaches k)."""
        n, gen = np.asarray(prompt, float), np.asarray(gen, float)
        if not self.evicts:
            return windowed(model, n + 0.5 * gen)
        return windowed(model, np.minimum(n + 0.5 * gen, self.budget(prompt, cache_ratio)) + 1.0)

    @property
    def appended_tokens(self) -> float:
        """Tokens held over the decode-time length at the peak: an evicting policy holds its appended token
        until it evicts one (1), a growing cache reserves its final length already (0)."""
        return 1.0 if self.evicts else 0.0

    # --- memory and operators ---
    def state_bytes(self, model, rows, kv_tokens):
        """Bytes of the policy's own state for `rows` sequences holding `kv_tokens` per KV head: none here."""
        return 0.0

    def decode_ops(self, ctx: OpContext) -> list[Op]:
        """The policy's own operators of a decode step; eviction by position (the new token overwrites the
        oldest slot) costs none."""
        return []

    def prefill_ops(self, ctx: OpContext) -> list[Op]:
        """The policy's own operators after the prompt: none for a positional policy."""
        return []

    def eager_path(self, stack: str) -> Mapping[str, float] | None:
        """The score path's kernels and passes in the eager stack `stack`; None: the policy has none."""
        return self.eager_paths.get(stack)
