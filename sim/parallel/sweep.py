"""Sweep columns of issue 18: design points on tp x pp devices, and energy and cost per token.

`evaluate(points)` is the sweep's analytic evaluate for tables that carry `tp` and `pp` columns (one
sim.parallel.predict per point: the sweep's output columns plus PARALLEL_COLUMNS). `energy_columns(points)`
adds ENERGY_COLUMNS to any table of points (tp = pp = 1 where the columns are absent); it is computed fresh,
outside the result cache, since the platform files it reads are not part of the points' identity.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from sim.energy import PARTS, energy_summary
from sim.cost import cost_summary

from .predict import predict

PARALLEL_COLUMNS = ["devices", "micro_batches", "bubble_factor", "comm_decode_s", "comm_prefill_s", "kv_replication",
                    "weight_bytes_per_device", "model_weight_bytes", "kv_bytes_per_token_per_device", "interconnect"]
ENERGY_COLUMNS = ["energy_j_per_token", "prefill_energy_j_per_token", "energy_j_per_output_token",
                  *[f"decode_{p}_j_per_token" for p in PARTS], "decode_power_w_per_device", "power_capped",
                  "cost_per_mtok", "cost_per_mtok_at_max_batch", "price_usd_per_hour"]
SUMMARY_KEYS = ("ttft_s", "tpot_s", "e2e_s", "tokens_per_s", "peak_memory_bytes", "max_batch", "max_batch_tokens_per_s",
                "max_batch_all_at_once", "max_batch_all_at_once_tokens_per_s")


def _predict_row(r: dict, tp: int, pp: int):
    return predict(r["hw"], r["model"], int(r["batch"]), int(r["prompt"]), int(r["gen"]), r["policy"],
                   float(r["cache_ratio"]), recent_ratio=float(r["recent_ratio"]), kv_dtype=r["kv_dtype"],
                   weight_dtype=r["weight_dtype"], profile=r["profile"], beams=int(r["beams"]), tp=tp, pp=pp)


def _degrees(r: dict) -> tuple[int, int]:
    return int(r.get("tp", 1) or 1), int(r.get("pp", 1) or 1)


def evaluate(points: pd.DataFrame, output_columns=None) -> pd.DataFrame:
    """One row per point (same order): `output_columns` (default: the sweep's) plus PARALLEL_COLUMNS."""
    if output_columns is None:
        from sim.sweep.analytic import OUTPUT_COLUMNS as output_columns
    points = points.reset_index(drop=True)
    rows = []
    for r in points.to_dict("records"):
        p = _predict_row(r, *_degrees(r))
        values = {**p.extra, **{k: getattr(p, k) for k in SUMMARY_KEYS}}
        values.setdefault("max_batch_tpot_s", np.nan)
        rows.append({c: values.get(c, np.nan) for c in [*output_columns, *PARALLEL_COLUMNS]})
    return pd.DataFrame(rows, columns=[*output_columns, *PARALLEL_COLUMNS], index=points.index)


def energy_columns(points: pd.DataFrame, price: float | None = None) -> pd.DataFrame:
    """ENERGY_COLUMNS for each point (None where the device has no energy or price data)."""
    points = points.reset_index(drop=True)
    rows = []
    for r in points.to_dict("records"):
        p = _predict_row(r, *_degrees(r))
        e, c = energy_summary(p), cost_summary(p, override=price)
        parts = e["decode_energy_breakdown_j_per_token"] or {}
        rows.append(dict(energy_j_per_token=e["energy_j_per_token"],
                         prefill_energy_j_per_token=e["prefill_energy_j_per_token"],
                         energy_j_per_output_token=e["energy_j_per_output_token"],
                         **{f"decode_{k}_j_per_token": parts.get(k) for k in PARTS},
                         decode_power_w_per_device=e["decode_power_w_per_device"], power_capped=e["power_capped"],
                         cost_per_mtok=c["cost_per_mtok"], cost_per_mtok_at_max_batch=c["cost_per_mtok_at_max_batch"],
                         price_usd_per_hour=c["price_usd_per_hour"]))
    return pd.DataFrame(rows, columns=ENERGY_COLUMNS, index=points.index)
