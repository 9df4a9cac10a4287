"""Latency, throughput and capacity of one design point on tp x pp devices (sim/parallel/__init__.py).

The single-device engine times one device's share (the largest stage of one TP rank, `shard_model`) at a
micro-batch; this module adds the collectives over the interconnect, the pipeline schedule and the
capacity of the deployment. Operator tables of the result are deployment-wide: FLOPs and bytes summed
over all devices (decode: one cycle, every request advancing one token; prefill: the whole batch), with
the collectives as extra rows (`link_bytes` column); `time_s` is one device's busy time in them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from hwmodels.dtypes import dtype_bytes
from hwmodels.platform import load_interconnect
from sim import capacity, engine
from sim.models import load_model

from .collectives import collectives, comm_table
from .shard import ONCE_PER_STEP_OPS, check_degrees, kv_replication, largest_stage, shard_model


@dataclass
class ParallelPrediction:
    inputs: dict
    ttft_s: float
    tpot_s: float
    e2e_s: float
    tokens_per_s: float
    peak_memory_bytes: float          # per device (the largest stage)
    max_batch: int                    # requests the deployment holds in the steady state
    max_batch_tokens_per_s: float
    max_batch_all_at_once: int
    max_batch_all_at_once_tokens_per_s: float
    prefill_ops: pd.DataFrame         # deployment-wide (all devices), collectives included
    decode_ops: pd.DataFrame          # per decode cycle, rows for step in {first, mean, last}
    stage: engine.Prediction          # one device at one micro-batch, as the engine predicts it
    extra: dict = field(default_factory=dict)

    # the same summary and flat dict as a one-device Prediction (the fields they read exist here too)
    summary = engine.Prediction.summary
    to_dict = engine.Prediction.to_dict


def micro_batches(batch, pp: int, fixed: int | None = None):
    """Micro-batches a batch is split into: `fixed` (at most the batch), default min(batch, pp)."""
    b = np.asarray(batch, float)
    return np.minimum(b, float(fixed)) if fixed else np.minimum(b, float(pp))


def waves(batch: int, at_once: int) -> tuple[int, int]:
    """(waves, requests in the last one) of a fixed batch on a deployment that holds at most `at_once` requests
    at their peak: a batcher that re-batches its queue, or an engine that admits what fits and runs the rest
    after (what a static benchmark of more requests than the KV memory holds measures). A paged engine that
    admits every request and preempts as the caches grow lies between the waves' throughput (its lower
    bound) and the as-if-it-fit number. (1, batch) when the batch fits; (0, 0) when not one request does."""
    if at_once <= 0:
        return 0, 0
    n = -(-int(batch) // int(at_once))
    return n, int(batch) - (n - 1) * int(at_once)


def _waves_keys(batch: int, gen: int, at_once: int, e2e) -> dict:
    """`waves`, `e2e_in_waves_s`, `tokens_per_s_in_waves` (e2e(b): one fixed batch of b requests end to end)."""
    n, last = waves(batch, at_once)
    if n == 0:
        return dict(waves=0, e2e_in_waves_s=float("nan"), tokens_per_s_in_waves=0.0)
    total = e2e(batch) if n == 1 else (n - 1) * e2e(at_once) + e2e(last)
    return dict(waves=n, e2e_in_waves_s=float(total), tokens_per_s_in_waves=float(batch * gen / total))


@dataclass(frozen=True)
class _Plan:
    """Everything fixed for one deployment; `times(batches)` is vectorised over request batch sizes."""
    hw: object
    model: object
    stage: object
    tp: int
    pp: int
    link: object
    setup: object
    kw: dict
    fixed_micro: int | None
    kv_override: object

    def comm(self, tokens, logits_rows):
        s = self.setup
        return collectives(self.model, self.stage, tokens, self.tp, self.pp, self.link, s.ab, s.launch_s, logits_rows)

    def times(self, batches) -> dict:
        b = np.atleast_1d(np.asarray(batches, float))
        m = micro_batches(b, self.pp, self.fixed_micro)
        bm = np.ceil(b / m)
        kw, host = self.kw, self.setup.host_s
        if self.kv_override is None:
            r = engine.evaluate(self.hw, self.stage, kw["policy"], batch=bm, **_engine_kw(kw), with_capacity=False)
            ttft, tpot = r["ttft_s"], r["tpot_s"]
        else:                               # a trace's lengths apply to one point at a time
            rs = [engine.evaluate(self.hw, self.stage, kw["policy"], batch=x, **_engine_kw(kw), with_capacity=False,
                                  kv_override=self.kv_override) for x in bm]
            ttft, tpot = (np.array([r[k][0] for r in rs]) for k in ("ttft_s", "tpot_s"))
        rows = bm * kw["beams"]
        dec = sum((c.time_s for c in self.comm(rows, rows)), np.zeros_like(b))
        pre = sum((c.time_s for c in self.comm(rows * kw["prompt"], rows)), np.zeros_like(b))
        cycle = np.maximum(m, self.pp)
        tpot_p = np.where(kw["gen"] > 1, cycle * (tpot - host + dec) + host, 0.0)
        ttft_p = (m + self.pp - 1) * (ttft - host + pre) + host
        e2e = ttft_p + max(kw["gen"] - 1.0, 0.0) * tpot_p
        return dict(ttft_s=ttft_p, tpot_s=tpot_p, e2e_s=e2e, micro_batches=m, micro_batch=bm, comm_decode_s=dec,
                    comm_prefill_s=pre, stage_ttft_s=ttft, stage_tpot_s=tpot)

    def decode_roofline(self, batch) -> dict:
        """One device's decode memory and compute time at the point's micro-batch (engine.evaluate)."""
        bm = np.ceil(np.atleast_1d(float(batch)) / micro_batches(batch, self.pp, self.fixed_micro))
        kw = self.kw
        r = engine.evaluate(self.hw, self.stage, kw["policy"], batch=bm, **_engine_kw(kw), with_capacity=False,
                            kv_override=self.kv_override)
        return {k: float(r[k][0]) for k in ("decode_memory_time_s", "decode_compute_time_s")}


def _engine_kw(kw: dict) -> dict:
    keys = ("prompt", "gen", "cache_ratio", "recent_ratio", "beams", "kv_dtype", "weight_dtype", "profile")
    return {k: kw[k] for k in keys}


def _override_for_stage(kv_override, model, pp: int):
    if kv_override is None:
        return None
    arr = np.asarray(kv_override, float)
    if arr.ndim != 2 or arr.shape[1] != model.n_layers:
        raise ValueError(f"kv_override must have one column per layer ({model.n_layers}), got shape {arr.shape}")
    layers = largest_stage(model, pp)
    return arr[:, layers.start:layers.stop]


def _deployment_table(table: pd.DataFrame, model, stage, tp: int, pp: int, copies: float, colls, busy: float) -> pd.DataFrame:
    """One device's table at one micro-batch -> all devices: per-layer rows x (layers / stage layers),
    once-per-step rows once, x tp ranks x `copies` micro-batch passes; collectives x every device."""
    per_layer = ~table["op"].isin(ONCE_PER_STEP_OPS)
    scale = np.where(per_layer, model.n_layers / stage.n_layers, 1.0) * tp * copies
    out = table.copy()
    for col in ("flops", "weight_bytes", "act_bytes", "kv_read_bytes", "kv_write_bytes"):
        out[col] = out[col] * scale
    out["time_s"] = out["time_s"] * busy
    out["link_bytes"] = 0.0
    comm = comm_table(colls, model, stage, tp, pp, passes=copies)
    comm["time_s"] = comm["time_s"] * busy
    return pd.concat([out, comm], ignore_index=True) if len(comm) else out


def predict(hw, model, batch, prompt, gen, policy, cache_ratio, recent_ratio=0.3, kv_dtype="bf16",
            weight_dtype="bf16", profile="auto", kv_override=None, beams=1, *, tp: int = 1, pp: int = 1,
            micro_batches: int | None = None) -> ParallelPrediction:
    """engine.predict for tp x pp devices; tp = pp = 1 (and no micro-batch count) wraps it unchanged."""
    check_degrees(tp, pp)
    if micro_batches is not None and (not isinstance(micro_batches, int) or micro_batches < 1):
        raise ValueError(f"micro_batches must be a positive integer, got {micro_batches!r}")
    kw = dict(policy=policy, prompt=prompt, gen=gen, cache_ratio=cache_ratio, recent_ratio=recent_ratio,
              beams=beams, kv_dtype=kv_dtype, weight_dtype=weight_dtype, profile=profile)
    full = load_model(model)
    if tp == 1 and pp == 1 and micro_batches in (None, 1):
        p = engine.predict(hw, full, batch, kv_override=kv_override, **kw)
        r = engine.evaluate(hw, full, policy, batch=batch, **_engine_kw(kw),
                            kv_override=kv_override)
        sweep_only = {k: float(r[k][0]) for k in ("max_batch_tpot_s", "decode_memory_time_s", "decode_compute_time_s")}
        e2e = lambda b: p.e2e_s if b == batch else float(engine.evaluate(
            hw, full, policy, batch=b, **_engine_kw(kw), kv_override=kv_override, with_capacity=False)["e2e_s"][0])
        sweep_only.update(_waves_keys(batch, gen, p.max_batch_all_at_once, e2e))
        extra = dict(p.extra, tp=1, pp=1, devices=1, micro_batches=1, bubble_factor=1.0, comm_decode_s=0.0,
                     comm_prefill_s=0.0, kv_replication=1.0, weight_bytes_per_device=p.extra["weight_bytes"],
                     model_weight_bytes=p.extra["weight_bytes"], **sweep_only,
                     kv_bytes_per_token_per_device=p.extra["kv_bytes_per_token"], interconnect=None)
        tables = [t.assign(link_bytes=0.0) for t in (p.prefill_ops, p.decode_ops)]
        return ParallelPrediction(inputs=dict(p.inputs, tp=1, pp=1), ttft_s=p.ttft_s, tpot_s=p.tpot_s, e2e_s=p.e2e_s,
                                  tokens_per_s=p.tokens_per_s, peak_memory_bytes=p.peak_memory_bytes,
                                  max_batch=p.max_batch, max_batch_tokens_per_s=p.max_batch_tokens_per_s,
                                  max_batch_all_at_once=p.max_batch_all_at_once,
                                  max_batch_all_at_once_tokens_per_s=p.max_batch_all_at_once_tokens_per_s,
                                  prefill_ops=tables[0], decode_ops=tables[1], stage=p, extra=extra)
    device = engine.resolve_device(hw)
    link = load_interconnect(device)
    if link is None and tp * pp > 1:
        raise ValueError(f"device {device.name} has no interconnect data (hwmodels/platform/{device.name}.yaml, or "
                         "<device file>.platform.yaml next to a device file): tp/pp > 1 cannot be timed")
    if link is not None and tp * pp > link.max_devices:
        raise ValueError(f"tp x pp = {tp * pp} devices exceeds the {link.max_devices} one {link.kind} domain "
                         f"of {device.name} joins (multi-node parallelism is not modelled)")
    stage = shard_model(full, tp, pp)
    setup = engine.make_setup(device, stage, policy, weight_dtype, kv_dtype, profile)
    override = _override_for_stage(kv_override, full, pp)
    plan = _Plan(device, full, stage, tp, pp, link, setup, kw, micro_batches, override)
    # capacity: the largest stage's device holds every request's KV for its layers
    cap = engine.evaluate(device, stage, policy, batch=batch, **_engine_kw(kw), kv_override=override)
    every, steady = int(cap["max_batch_all_at_once"][0]), int(cap["max_batch"][0])
    if capacity.continuous(setup):
        per_prefill = float(capacity.prefilling(setup, max(steady, 1), prompt))
    else:
        per_prefill = float(max(steady, 1))
    n_waves, last = waves(batch, every)
    t = plan.times([batch, max(every, 1), per_prefill, max(steady, 1), max(last, 1)])
    tokens_per_s = batch * gen / t["e2e_s"][0]
    every_tps = every * gen / t["e2e_s"][1] if every > 0 else 0.0
    steady_tps = float(capacity.saturated_tokens_per_s(steady, gen, per_prefill, t["ttft_s"][2], t["tpot_s"][3]))
    # operator tables: one device at the point's micro-batch, made deployment-wide
    m, bm = float(t["micro_batches"][0]), int(t["micro_batch"][0])
    stage_pred = engine.predict(device, stage, bm, kv_override=override, **kw)
    rows = bm * beams
    pre_colls, dec_colls = plan.comm(rows * prompt, rows), plan.comm(rows, rows)
    prefill_ops = _deployment_table(stage_pred.prefill_ops, full, stage, tp, pp, m, pre_colls, busy=m)
    decode_ops = pd.concat([_deployment_table(g.drop(columns="step"), full, stage, tp, pp, m, dec_colls, busy=m)
                            .assign(step=label)[["step", *engine.TABLE_COLUMNS, "link_bytes"]]
                            for label, g in stage_pred.decode_ops.groupby("step", sort=False)], ignore_index=True)
    kvb = dtype_bytes(stage_pred.inputs["kv_dtype"])
    extra = dict(stage_pred.extra, tp=tp, pp=pp, devices=tp * pp, micro_batches=m,
                 bubble_factor=float(max(m, pp) / m), comm_decode_s=float(t["comm_decode_s"][0]),
                 comm_prefill_s=float(t["comm_prefill_s"][0]), kv_replication=kv_replication(full.n_kv_heads, tp),
                 # weight_bytes: what one device holds (as peak_memory_bytes); model_weight_bytes: all of them
                 weight_bytes=float(cap["weight_bytes"][0]), weight_bytes_per_device=float(cap["weight_bytes"][0]),
                 model_weight_bytes=float(full.weight_bytes(stage_pred.inputs["weight_dtype"])),
                 kv_bytes_per_token_per_device=2.0 * stage.n_layers * stage.n_kv_heads * stage.head_dim * kvb,
                 kv_bytes_per_token=float(full.kv_bytes_per_token(stage_pred.inputs["kv_dtype"])),
                 max_batch_tpot_s=float(t["tpot_s"][3]) if steady > 0 else float("nan"),
                 **plan.decode_roofline(batch),
                 **_waves_keys(batch, gen, every, lambda b: float(t["e2e_s"][{batch: 0, every: 1}.get(b, 4)])),
                 fits=bool(cap["fits"][0]), interconnect=link.kind if link is not None else None, stage_layers=stage.n_layers,
                 exceeds_max_positions=bool(full.max_positions and prompt + gen > full.max_positions))
    inputs = dict(stage_pred.inputs, model=full.name, batch=int(batch), tp=tp, pp=pp)
    return ParallelPrediction(inputs=inputs, ttft_s=float(t["ttft_s"][0]), tpot_s=float(t["tpot_s"][0]),
                              e2e_s=float(t["e2e_s"][0]), tokens_per_s=float(tokens_per_s),
                              peak_memory_bytes=float(cap["peak_memory_bytes"][0]), max_batch=steady,
                              max_batch_tokens_per_s=steady_tps, max_batch_all_at_once=every,
                              max_batch_all_at_once_tokens_per_s=float(every_tps), prefill_ops=prefill_ops,
                              decode_ops=decode_ops, stage=stage_pred, extra=extra)
