"""Bindings from the DES to the analytic model: step times (sim.engine), KV lengths (sim.kvlen or a
captured trace), and the KV memory a device leaves after weights and workspace (sim.engine.memory_bytes).

Nothing here models hardware or operators itself: every second and byte comes from sim.engine, so the
DES and `sim.predict` cannot drift apart.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sim import engine, kvlen

MEMO_SIZE = 1 << 16     # prefill step times remembered per timer


class AnalyticTimer:
    """Step times of one (device, model, policy, dtypes, profile) from sim.engine."""

    def __init__(self, hw, model, *, policy: str, cache_ratio: float, recent_ratio: float,
                 weight_dtype: str, kv_dtype: str, profile: str):
        self.hw, self.model = hw, model
        common = dict(weight_dtype=weight_dtype, kv_dtype=kv_dtype, policy=policy, profile=profile)
        self._decode_kw = dict(common, recent_ratio=recent_ratio)
        self._prefill_kw = dict(common, cache_ratio=cache_ratio, recent_ratio=recent_ratio)
        self._prefill_memo: dict[tuple, float] = {}

    def decode(self, kv: np.ndarray) -> float:
        return engine.decode_step_time(self.hw, self.model, kv, **self._decode_kw)

    def prefill(self, chunks) -> float:
        # a pure function of the chunks, which repeat (fixed prompt lengths admit the same groups again and
        # again): remembered, exact
        key = tuple(chunks)
        hit = self._prefill_memo.get(key)
        if hit is None:
            if len(self._prefill_memo) >= MEMO_SIZE:
                self._prefill_memo.clear()
            hit = self._prefill_memo[key] = engine.prefill_time(self.hw, self.model, chunks, **self._prefill_kw)
        return hit

    def mixed(self, kv: np.ndarray, chunks) -> float:
        return engine.mixed_step_time(self.hw, self.model, kv, chunks, **self._prefill_kw)


class _KVSource:
    """What every KV source of a model says about its prefill (the scheduler's `prompt_kv`)."""
    model = None

    def prompt_kv(self, tokens):
        """Tokens per KV head a prefill of `tokens` leaves held (sliding-window layers: their window)."""
        return kvlen.windowed(self.model, tokens)


class PolicyKV(_KVSource):
    """Cached tokens per KV head at each decode step from the policy's formula (sim.kvlen); with `model`,
    the mean over its layers (sliding-window layers hold at most their window)."""

    def __init__(self, policy: str, cache_ratio: float, model=None):
        self.policy, self.cache_ratio = kvlen.check_policy(policy), cache_ratio
        self.model = model
        self._cache: dict[tuple[int, int], np.ndarray] = {}

    def decode_kv(self, request: int, prompt: int, gen: int) -> np.ndarray:
        key = (prompt, gen)
        if key not in self._cache:
            steps = np.arange(max(gen - 1, 1), dtype=float)
            self._cache[key] = np.asarray(kvlen.kv_tokens(self.policy, prompt, steps, self.cache_ratio,
                                                          model=self.model), float)
        return self._cache[key]


class TraceKV(_KVSource):
    """Cached tokens per KV head from a captured trace (traces.Trace.kv_override_per_sample), so that
    heterogeneous budgets across requests, layers and heads cost what they cost in the real run.

    Each sample's (gen + 1, n_layers) array is averaged over layers (the step-time model takes the mean
    per request; memory is exactly mean x all layers). Request i replays sample i mod n_samples.
    """

    def __init__(self, trace, policy: str, cache_ratio: float, n_layers: int, heads: str = "mean", model=None):
        self.trace, self.policy, self.cache_ratio = trace, policy, cache_ratio
        self.n_layers, self.heads = n_layers, heads
        self.model = model      # with sliding-window layers: each capped at its window (sim.kvlen)
        self._cache: dict[tuple[int, int], list[np.ndarray]] = {}

    def decode_kv(self, request: int, prompt: int, gen: int) -> np.ndarray:
        key = (prompt, gen)
        if key not in self._cache:
            per_sample, _ids = self.trace.kv_override_per_sample(self.policy, self.cache_ratio, prompt, gen,
                                                                  self.n_layers, heads=self.heads)
            self._cache[key] = [np.ascontiguousarray(kvlen.windowed_per_layer(self.model, s).mean(axis=1))
                                for s in per_sample]
        samples = self._cache[key]
        if not samples:
            raise ValueError(f"trace has no samples for {self.policy} at cache ratio {self.cache_ratio:g}")
        return samples[request % len(samples)]

    @property
    def n_samples(self) -> int:
        return max((len(v) for v in self._cache.values()), default=0)


def load_trace(path):
    """traces.load(path), imported lazily (the trace reader is optional for the DES); an already
    loaded Trace passes through, so a sweep can load a folder once for many points."""
    if hasattr(path, "kv_override_per_sample"):
        return path
    if not Path(path).is_dir():
        raise FileNotFoundError(f"trace folder {path} not found")
    try:
        import traces
    except ImportError as exc:
        raise ValueError(f"--trace needs the trace reader (traces package): {exc}") from None
    return traces.load(path)


@dataclass(frozen=True)
class MemoryBudget:
    """How the device memory splits: weights, one step's workspace, and what is left for the KV cache."""

    device_bytes: float
    usable_bytes: float        # device_bytes x memory_utilization
    weight_bytes: float
    workspace_bytes: float     # activations of the largest step + one row of logits (sim.engine.memory_bytes)
    kv_bytes_per_token: float  # K and V of all layers, plus the fp32 score per token of scored policies

    @property
    def kv_capacity_bytes(self) -> float:
        return max(self.usable_bytes - self.weight_bytes - self.workspace_bytes, 0.0)


def memory_budget(hw, model, *, policy: str, kv_dtype: str, weight_dtype: str, profile: str,
                  step_tokens: int, memory_utilization: float) -> MemoryBudget:
    """Like vLLM's profiling run: the KV cache gets what weights and the largest step leave.

    Every byte comes from sim.engine.memory_bytes (one request, `step_tokens` of prefill): the workspace is
    its footprint without KV minus the weights, the bytes per token its increment per cached token (K and
    V, the fp32 score of H2O/Keyformer, and whatever the operator profile adds)."""
    s = engine.make_setup(hw, model, policy, weight_dtype, kv_dtype, profile)

    def footprint(kv_tokens: float) -> float:
        return float(engine.memory_bytes(s.model, 1, kv_tokens, prompt=step_tokens, kv_dtype=s.kv_dtype,
                                         weight_dtype=s.weight_dtype, policy=s.policy, profile=s.profile,
                                         hw=s.hw))

    weights = float(s.model.weight_bytes(s.weight_dtype))
    no_kv = footprint(0.0)
    device = float(s.hw.memory_bytes)
    return MemoryBudget(device_bytes=device, usable_bytes=device * memory_utilization, weight_bytes=weights,
                        workspace_bytes=no_kv - weights, kv_bytes_per_token=footprint(1.0) - no_kv)
