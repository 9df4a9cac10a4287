"""What the simulator says for each validation point: reference metrics and measured timing points.

Everything goes through the engine's public entries (`sim.engine.predict`, `decode_step_time`,
`prefill_time`) with the profile named by the point, so the report validates exactly what users run.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from kvcommon.design import DEFAULT_RECENT_RATIO
from sim import engine
from sim.ops import BYTE_FIELDS
from sim.validation.references import Run

KV_FIELDS = ("kv_read_bytes", "kv_write_bytes")


@lru_cache(maxsize=None)
def _device(name: str):
    return engine.resolve_device(name)


@lru_cache(maxsize=None)
def run_prediction(run: Run, profile: str | None = None):
    """engine.predict for one simulated request (cached: ratio rows share their baseline)."""
    return engine.predict(_device(run.device), run.model, run.batch, run.prompt, run.gen, run.policy,
                          run.cache_ratio, kv_dtype=run.dtype, weight_dtype=run.dtype,
                          profile=profile or run.profile, beams=run.beams)


def kv_movement_s(table) -> float:
    """KV data-movement time of one operator table: each op's time times the KV share of its bytes."""
    total = table[list(BYTE_FIELDS)].sum(axis=1)
    kv = table[list(KV_FIELDS)].sum(axis=1)
    share = np.where(total > 0, kv / total.where(total > 0, 1.0), 0.0)
    return float((table["time_s"] * share).sum())


def request_kv_movement_s(prediction) -> float:
    """KV data-movement time of a whole request: prefill plus (gen - 1) mean decode steps."""
    decode = prediction.decode_ops[prediction.decode_ops["step"] == "mean"]
    steps = max(prediction.inputs["gen"] - 1, 0)
    return kv_movement_s(prediction.prefill_ops) + steps * kv_movement_s(decode)


def reference_value(metric: str, run: Run, base: Run | None, profile: str | None = None) -> float:
    """The simulator's value of a reference row's metric (see references.py for the definitions)."""
    pred = run_prediction(run, profile)
    if metric == "tokens_per_s":
        return pred.tokens_per_s
    if metric == "max_batch":       # a static batch (HF generate): every request at its peak at once
        return float(pred.max_batch_all_at_once)
    if metric == "kv_time_share":
        return request_kv_movement_s(pred) / pred.e2e_s
    base_pred = run_prediction(base, profile)
    if metric == "speedup":
        return pred.tokens_per_s / base_pred.tokens_per_s
    if metric == "kv_movement_ratio":
        return request_kv_movement_s(pred) / request_kv_movement_s(base_pred)
    raise ValueError(f"unknown metric {metric!r}")


def decode_step_s(device, model, batch: int, attended_tokens: float, policy: str, dtype: str, profile: str,
                  recent_ratio: float = DEFAULT_RECENT_RATIO, beams: int = 1) -> float:
    """One decode step where each of `batch` requests (x `beams` beams) attends over `attended_tokens`
    slots (newcomer included): the engine's `past_tokens` is that minus the appended token."""
    past = max(float(attended_tokens) - 1.0, 0.0)
    return engine.decode_step_time(_device(device) if isinstance(device, str) else device, model,
                                   np.full(int(batch), past), weight_dtype=dtype, kv_dtype=dtype,
                                   policy=policy, profile=profile, recent_ratio=recent_ratio, beams=beams)


def prefill_s(device, model, batch: int, prompt: int, dtype: str, profile: str) -> float:
    return engine.prefill_time(_device(device) if isinstance(device, str) else device, model,
                               [(int(prompt), 0)] * int(batch), weight_dtype=dtype, kv_dtype=dtype,
                               policy="full", profile=profile)


def decode_bytes(device, model, batch: int, attended_tokens: float, policy: str, dtype: str,
                 profile: str, beams: int = 1) -> tuple[float, float]:
    """(weight bytes, KV bytes) one decode step moves: tells a weight-bound point from a KV-bound one."""
    s = engine.make_setup(_device(device) if isinstance(device, str) else device, model, policy, dtype, dtype,
                          profile)
    ctx = engine.make_ctx(s, "decode", float(batch), float(beams), 1.0, max(float(attended_tokens) - 1.0, 0.0))
    timed = engine.time_ops(s, engine.forward_ops(ctx))
    weights = float(np.sum(timed.fields["weight_bytes"]))
    kv = float(np.sum(timed.fields["kv_read_bytes"]) + np.sum(timed.fields["kv_write_bytes"]))
    return weights, kv
