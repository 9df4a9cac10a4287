"""The analytic engine over a table of design points: `evaluate(points)`, one output row per point."""
from __future__ import annotations

import sys

import numpy as np
import pandas as pd

from sim import engine
from sim.models import load_model
from sim.sweep.grid import GROUP_COLUMNS

OUTPUT_COLUMNS = ["ttft_s", "tpot_s", "e2e_s", "tokens_per_s", "peak_memory_bytes", "fits", "max_batch",
                  "max_batch_tokens_per_s", "max_batch_tpot_s", "max_batch_all_at_once",
                  "max_batch_all_at_once_tokens_per_s", "decode_bound", "decode_kv_read_bytes",
                  "decode_memory_time_s", "decode_compute_time_s", "kv_bytes_per_token", "peak_kv_tokens",
                  "weight_bytes", "device_memory_bytes", "exceeds_max_positions"]


def _names(values: np.ndarray):
    """One name when all points share it (the engine's scalar fast path), else the array of names."""
    return values[0] if (values == values[0]).all() else values


def evaluate(points: pd.DataFrame, progress: bool = False) -> pd.DataFrame:
    """Outputs for each row of `points` (same order, fresh RangeIndex). Pure: chunks evaluate alike.

    `hw` and `model` cells are names or file paths; only INPUT_COLUMNS are read."""
    from hwmodels import load_device
    from tqdm import tqdm
    points = points.reset_index(drop=True)
    kinds = {"fits": bool, "max_batch": np.int64, "max_batch_all_at_once": np.int64, "decode_bound": object,
             "exceeds_max_positions": bool}
    out = {c: np.empty(len(points), dtype=kinds.get(c, float)) for c in OUTPUT_COLUMNS}
    devices, specs = {}, {}
    groups = points.groupby(GROUP_COLUMNS, sort=False).indices
    # plain numpy columns, indexed per group (much cheaper than slicing the DataFrame per group)
    cols = {c: points[c].to_numpy() for c in ("batch", "prompt", "gen", "cache_ratio", "recent_ratio", "beams",
                                              "kv_dtype", "weight_dtype")}
    # disable=None: the bar shows on a terminal only, never in logs
    for key, idx in tqdm(groups.items(), desc="sweep", unit="group", disable=None if progress else True,
                         file=sys.stderr):
        hw_name, model_name, policy, profile = key
        if hw_name not in devices:
            devices[hw_name] = load_device(hw_name)
        if model_name not in specs:
            specs[model_name] = load_model(model_name)
        hw, spec = devices[hw_name], specs[model_name]
        g = {c: v[idx] for c, v in cols.items()}
        r = engine.evaluate(hw, spec, policy, batch=g["batch"], prompt=g["prompt"], gen=g["gen"],
                            cache_ratio=g["cache_ratio"], recent_ratio=g["recent_ratio"], beams=g["beams"],
                            kv_dtype=_names(g["kv_dtype"]), weight_dtype=_names(g["weight_dtype"]), profile=profile)
        r["device_memory_bytes"] = np.full(len(idx), float(hw.memory_bytes))
        total = g["prompt"] + g["gen"]
        r["exceeds_max_positions"] = total > spec.max_positions if spec.max_positions else np.zeros(len(idx), bool)
        for col in OUTPUT_COLUMNS:
            out[col][idx] = r[col]
    return pd.DataFrame(out, index=points.index)
