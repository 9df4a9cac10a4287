"""Memory and capacity by name: peak device memory and the largest batch that fits (the rules are
sim.capacity's, on a resolved Setup)."""
from __future__ import annotations

import math

import numpy as np

from hwmodels.device import NEUTRAL
from sim import capacity, kvlen, policies
from sim.engine.setup import make_setup

MAX_BATCH_LIMIT = capacity.MAX_BATCH_LIMIT


def memory_bytes(model, batch, kv_tokens, *, prompt, beams=1, kv_dtype="bf16", weight_dtype="bf16",
                 policy="full", profile="auto", hw=None):
    """Peak device memory: weights + KV (rows x kv_tokens) + score state + prefill workspace + logits
    (+ the profile's own buffers). `kv_tokens` is the most tokens a KV head holds at once
    (sim.kvlen.peak_kv_tokens). `hw` only matters to profiles whose buffers depend on the device."""
    s = make_setup(hw if hw is not None else NO_DEVICE, model, policy, weight_dtype, kv_dtype, profile)
    rows = np.asarray(batch, float) * np.asarray(beams, float)
    return capacity.memory(s, rows, np.asarray(kv_tokens, float), np.asarray(prompt, float))


def peak_kv_tokens(s, prompt, gen, cache_ratio):
    """Most tokens per KV head (mean over layers) a request holds at once on this stack. The policy's own
    peak (sim.kvlen.peak_kv_tokens) holds the whole prompt in every layer until the prefill ends; a stack
    that compresses layer by layer at prefill (Profile.layerwise_prefill_eviction, kvpress-style hooks)
    holds it in one layer only, the L - 1 layers prefilled before it already at what they keep (k):
    (n + (L - 1) k) / L, or the decode-time peak where that is larger (k + gen reserved for SnapKV, k + 1
    for a policy that evicts every step). Policies that keep the whole prompt are unchanged."""
    peak = kvlen.peak_kv_tokens(s.policy, prompt, gen, cache_ratio, model=s.model)
    if not s.profile.layerwise_prefill_eviction:
        return peak
    policy, n = policies.get(s.policy), np.asarray(prompt, float)
    whole = kvlen.windowed(s.model, n)
    kept = policy.kv_tokens(n, 0.0, cache_ratio, model=s.model)              # each layer after its prefill
    layers = float(s.model.n_layers)
    prefill = (whole + (layers - 1.0) * kept) / layers
    decode = policy.kv_tokens(n, np.asarray(gen, float), cache_ratio, model=s.model) + policy.appended_tokens
    return np.where(kept < whole, np.minimum(peak, np.maximum(prefill, decode)), peak)


def max_batch(hw, model, prompt, gen, *, policy="full", cache_ratio=1.0, beams=1, kv_dtype="bf16",
              weight_dtype="bf16", profile="auto", kv_peak_tokens=None):
    """Largest batch (requests) in the steady state of continuous batching: each request at what it holds
    averaged over its life, its prompt while prefilled, then what it keeps (sim.capacity); 0 when not even one
    request fits. `kv_peak_tokens` only matters to stacks without continuous batching."""
    s = make_setup(hw, model, policy, weight_dtype, kv_dtype, profile)
    n = np.asarray(prompt, float)
    peak = peak_kv_tokens(s, n, gen, cache_ratio) if kv_peak_tokens is None else np.asarray(kv_peak_tokens, float)
    return capacity.max_batch_steady(s, n, np.asarray(beams, float), peak, kvlen.windowed(s.model, n),
                                     kvlen.steady_kv_tokens(s.policy, n, gen, cache_ratio, model=s.model),
                                     np.asarray(gen, float))


def max_batch_all_at_once(hw, model, prompt, gen, *, policy="full", cache_ratio=1.0, beams=1, kv_dtype="bf16",
                          weight_dtype="bf16", profile="auto", kv_peak_tokens=None):
    """Largest batch (requests) whose peak memory fits with every request at its peak at once (a static
    batch, or a server reserving each request's peak); 0 when not even one fits."""
    s = make_setup(hw, model, policy, weight_dtype, kv_dtype, profile)
    peak_tokens = (peak_kv_tokens(s, prompt, gen, cache_ratio) if kv_peak_tokens is None
                   else np.asarray(kv_peak_tokens, float))
    return capacity.max_batch_all_at_once(s, np.asarray(prompt, float), np.asarray(beams, float), peak_tokens)


class NoDevice:
    """Stands in for a device where only memory is computed (no timing): the Device contract with unit
    figures and no calibrated tables."""
    name, memory_bytes, memory_bw, launch_overhead_s, host_overhead_s = "none", math.inf, 1.0, 0.0, 0.0
    tables = NEUTRAL

    @staticmethod
    def peak_flops(dtype):
        return 1.0

    @staticmethod
    def compute_efficiency(flops):
        return np.ones(np.shape(flops))

    @staticmethod
    def compute_equivalent_flops(flops, peak):
        return flops


NO_DEVICE = NoDevice()

