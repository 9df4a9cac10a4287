"""`evaluate`: every result for arrays of design points sharing (device, model, policy, profile): latency,
throughput, memory, and the capacity batches riding in the same pass over the operator tables."""
from __future__ import annotations

import numpy as np

from sim import capacity, kvlen, policies
from sim.engine.latency import check_override, stacked_latency
from sim.engine.memory import peak_kv_tokens
from sim.engine.setup import DtypeCodes, Setup, make_setup, per_point_dtypes


def evaluate(hw, model, policy, *, batch, prompt, gen, cache_ratio=1.0, recent_ratio=0.3, beams=1,
             kv_dtype="bf16", weight_dtype="bf16", profile="auto", kv_override=None, with_capacity=True,
             _keep_ops=False) -> dict:
    """All results for arrays of points sharing (device, model, policy, profile).

    Every numeric argument may be an array (broadcast together); `kv_dtype` and `weight_dtype` may be
    a name, an array of names, one per point, or their DtypeCodes."""
    arrays = np.broadcast_arrays(*(np.atleast_1d(np.asarray(v, float)) for v in
                                   (batch, beams, prompt, gen, cache_ratio, recent_ratio)))
    batch, beams, prompt, gen, cache_ratio, recent_ratio = arrays
    first = lambda d: d if isinstance(d, str) else d.first() if isinstance(d, DtypeCodes) else str(
        np.asarray(d, dtype=object).ravel()[0])
    s = make_setup(hw, model, policy, first(weight_dtype), first(kv_dtype), profile)
    s = per_point_dtypes(s, weight_dtype, kv_dtype, batch.size)
    validate_points(batch, beams, prompt, gen, cache_ratio, recent_ratio)
    if kv_override is not None:
        if batch.size != 1:
            raise ValueError("kv_override applies to a single design point")
        held = kvlen.windowed_per_layer(s.model, kv_override).mean(axis=1)   # all rows, incl. after the last step
        kv_override = kvlen.windowed_per_layer(s.model, check_override(kv_override, int(gen[0]), s.model.n_layers))
        # same convention as kvlen.peak_kv_tokens: full reserves its final length (last row = n+gen);
        # an evicting policy holds one token over its budget between append and eviction
        appended = policies.get(s.policy).appended_tokens
        peak_tokens = np.array([max(float(kvlen.windowed(s.model, prompt[0])), held.max() + appended)])
    else:
        peak_tokens = peak_kv_tokens(s, prompt, gen, cache_ratio)     # the stack's (layer-wise prefill eviction)
    # one pass over the operator tables for the points and, stacked after them, the capacity batches:
    # prefill at (batch, all-at-once batch, steady prefill rows), decode at (batch, all at once, steady)
    if with_capacity:
        every, steady, per_prefill = capacity_batches(s, beams, prompt, gen, cache_ratio, kv_override, peak_tokens)
        pre, dec = [batch, np.maximum(every, 1), per_prefill], [batch, np.maximum(every, 1), np.maximum(steady, 1)]
    else:
        pre = dec = [batch]
    lat = stacked_latency(s, pre, dec, beams, prompt, gen, cache_ratio, recent_ratio, kv_override, _keep_ops)
    n = batch.size
    out = {key: (v[:n] if not key.startswith("_") else v) for key, v in lat.items()}
    out["tokens_per_s"] = batch * gen / out["e2e_s"]
    m = s.model
    out["kv_bytes_per_token"] = np.broadcast_to(2.0 * m.n_layers * m.n_kv_heads * m.head_dim * s.kvb, batch.shape)
    out["weight_bytes"] = np.broadcast_to(m.weight_bytes_at(s.wb), batch.shape)
    out["peak_kv_tokens"] = peak_tokens
    out["peak_memory_bytes"] = capacity.memory(s, batch * beams, peak_tokens, prompt)
    out["fits"] = out["peak_memory_bytes"] <= float(s.hw.memory_bytes)
    if with_capacity:
        part = lambda key, i: lat[key][i * n:(i + 1) * n]
        every_e2e = part("e2e_s", 1)                      # prefill and decode both at the all-at-once batch
        out.update(max_batch_all_at_once=every,
                   max_batch_all_at_once_tokens_per_s=np.where(every > 0, every * gen / every_e2e, 0.0),
                   max_batch=steady,
                   max_batch_tokens_per_s=capacity.saturated_tokens_per_s(steady, gen, per_prefill, part("ttft_s", 2),
                                                                          part("tpot_s", 2)),
                   max_batch_tpot_s=np.where(steady > 0, part("tpot_s", 2), np.nan))
    return out




def capacity_batches(s: Setup, beams, prompt, gen, cache_ratio, kv_override, peak_tokens):
    """(all-at-once max batch, steady-state max batch, requests prefilled at once in the steady state)."""
    every = capacity.max_batch_all_at_once(s, prompt, beams, peak_tokens)
    if not capacity.continuous(s):                        # a static batch: the steady state is all at once
        return every, every, np.maximum(every, 1).astype(float)
    held = (kvlen.steady_kv_tokens(s.policy, prompt, gen, cache_ratio, model=s.model) if kv_override is None
            else np.array([capacity.held_tokens_from_override(s.policy, kv_override)]))
    steady = capacity.max_batch_steady(s, prompt, beams, peak_tokens, kvlen.windowed(s.model, prompt), held, gen)
    return every, steady, capacity.prefilling(s, np.maximum(steady, 1), prompt)


def validate_points(batch, beams, prompt, gen, cache_ratio, recent_ratio):
    checks = [(batch >= 1, "batch must be >= 1"), (beams >= 1, "beams must be >= 1"),
              (prompt >= 1, "prompt must be >= 1 token"), (gen >= 1, "gen must be >= 1 token"),
              ((cache_ratio > 0) & (cache_ratio <= 1), "cache ratio must be in (0, 1]"),
              ((recent_ratio >= 0) & (recent_ratio <= 1), "recent ratio must be in [0, 1]")]
    for ok, message in checks:
        if not np.all(ok):
            raise ValueError(message)


