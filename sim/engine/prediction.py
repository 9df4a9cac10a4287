"""One design point with its operator tables: `predict` and the `Prediction` it returns."""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from sim.engine.evaluation import evaluate
from sim.engine.setup import make_setup
from sim.engine.timing import TimedOps
from sim.op import BYTE_FIELDS, FIELDS
from sim.profiles import CORE_OPS

TABLE_COLUMNS = ["op", *FIELDS, "intensity", "bound", "time_s"]


def op_table(timed: TimedOps, index, weights=None) -> pd.DataFrame:
    """Operator table of one point; `weights` averages over decode-step nodes."""
    def pick(a):
        a = a[(slice(None),) + index]
        return (a * weights).sum(-1) if weights is not None else a
    data = {"op": timed.names, **{f: pick(timed.fields[f]) for f in FIELDS}}
    df = pd.DataFrame(data)
    total_bytes = df[list(BYTE_FIELDS)].sum(axis=1)
    df["intensity"] = np.where(total_bytes > 0, df["flops"] / total_bytes.where(total_bytes > 0, 1), np.inf)
    tc, tm = pick(timed.t_compute), pick(timed.t_memory)
    df["bound"] = np.where(tc >= tm, "compute", "memory")
    if timed.inside is not None:     # an op inside another's kernel: its time and bound are on that row
        df.loc[[host is not None for host in timed.inside], "bound"] = "fused"
    df["time_s"] = pick(timed.time)
    df = df.groupby("op", sort=False, as_index=False).agg(
        {**{f: "sum" for f in FIELDS}, "intensity": "first", "bound": "first", "time_s": "sum"})[TABLE_COLUMNS]
    # data-flow order for reading; a profile's extra ops follow the core ones
    order = {name: i for i, name in enumerate(CORE_OPS)}
    return df.sort_values("op", key=lambda c: c.map(lambda n: order.get(n, len(order))), kind="stable",
                          ignore_index=True)


@dataclass
class Prediction:
    inputs: dict
    ttft_s: float
    tpot_s: float
    e2e_s: float
    tokens_per_s: float
    peak_memory_bytes: float
    max_batch: int                # steady state of continuous batching (sim.capacity)
    max_batch_tokens_per_s: float
    prefill_ops: pd.DataFrame
    decode_ops: pd.DataFrame      # rows for step in {first, mean, last}; column "step"
    extra: dict = field(default_factory=dict)
    max_batch_all_at_once: int = 0            # every request at its peak at once (static batch, reserve admission)
    max_batch_all_at_once_tokens_per_s: float = 0.0
    # the loaded hardware file (not its name): energy and cost read its own platform data (sim.energy)
    device: object = field(default=None, repr=False, compare=False)

    def summary(self) -> dict:
        keys = ("ttft_s", "tpot_s", "e2e_s", "tokens_per_s", "peak_memory_bytes", "max_batch", "max_batch_tokens_per_s",
                "max_batch_all_at_once", "max_batch_all_at_once_tokens_per_s")
        return {k: getattr(self, k) for k in keys}

    def to_dict(self) -> dict:
        return {**self.inputs, **self.summary(), **self.extra}

    def to_json(self, **kw) -> str:
        return json.dumps(self.to_dict(), **kw)


def predict(hw, model, batch, prompt, gen, policy, cache_ratio, recent_ratio=0.3, kv_dtype="bf16",
            weight_dtype="bf16", profile="auto", kv_override=None, beams=1) -> Prediction:
    s = make_setup(hw, model, policy, weight_dtype, kv_dtype, profile)
    r = evaluate(s.hw, s.model, s.policy, batch=batch, prompt=prompt, gen=gen, cache_ratio=cache_ratio,
                 recent_ratio=recent_ratio, beams=beams, kv_dtype=s.kv_dtype, weight_dtype=s.weight_dtype,
                 profile=s.profile, kv_override=kv_override, _keep_ops=True)
    pre, dec, weights = r["_prefill"], r["_decode"], r["_weights"]
    prefill_ops = op_table(pre, (0, 0))
    last = weights.shape[-1] - 1
    tables = []
    for label, index, w in (("first", (0, 0), None), ("mean", (0, slice(None)), weights[0]), ("last", (0, last), None)):
        t = op_table(dec, index, w)
        t.insert(0, "step", label)
        tables.append(t)
    inputs = dict(hw=s.hw.name, model=s.model.name, batch=int(batch), beams=int(beams), prompt=int(prompt),
                  gen=int(gen),
                  policy=s.policy, cache_ratio=float(cache_ratio), recent_ratio=float(recent_ratio),
                  kv_dtype=s.kv_dtype, weight_dtype=s.weight_dtype, profile=s.profile.name,
                  kv_source="trace" if kv_override is not None else "formula")
    extra = dict(decode_bound=str(r["decode_bound"][0]), kv_bytes_per_token=float(r["kv_bytes_per_token"][0]),
                 peak_kv_tokens=float(r["peak_kv_tokens"][0]), weight_bytes=float(s.model.weight_bytes(s.weight_dtype)),
                 decode_kv_read_bytes=float(r["decode_kv_read_bytes"][0]), fits=bool(r["fits"][0]),
                 device_memory_bytes=float(s.hw.memory_bytes),
                 # TPOT at the max batch, as sim.parallel's JSON and the sweep's column (None: nothing fits)
                 max_batch_tpot_s=float(r["max_batch_tpot_s"][0]) if np.isfinite(r["max_batch_tpot_s"][0]) else None,
                 exceeds_max_positions=bool(s.model.max_positions and prompt + gen > s.model.max_positions))
    if s.model.moe:     # what a decode step's rows (batch x beams tokens) read of the experts
        rows = int(batch) * int(beams)
        extra.update(n_experts=s.model.n_experts, decode_experts_touched=float(s.model.experts_touched(rows)),
                     decode_weight_bytes_read=float(s.model.weight_bytes_read(rows, s.weight_dtype)))
    return Prediction(inputs=inputs, ttft_s=float(r["ttft_s"][0]), tpot_s=float(r["tpot_s"][0]),
                      e2e_s=float(r["e2e_s"][0]), tokens_per_s=float(r["tokens_per_s"][0]),
                      peak_memory_bytes=float(r["peak_memory_bytes"][0]), max_batch=int(r["max_batch"][0]),
                      max_batch_tokens_per_s=float(r["max_batch_tokens_per_s"][0]),
                      prefill_ops=prefill_ops, decode_ops=pd.concat(tables, ignore_index=True), extra=extra,
                      max_batch_all_at_once=int(r["max_batch_all_at_once"][0]),
                      max_batch_all_at_once_tokens_per_s=float(r["max_batch_all_at_once_tokens_per_s"][0]),
                      device=s.hw)
