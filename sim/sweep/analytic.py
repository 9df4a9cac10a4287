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


def _dtypes(names: tuple, codes: np.ndarray, part: slice):
    """A group's dtypes: one name when all its points share it (the engine's scalar fast path), else codes."""
    mine = codes[part]
    low, high = mine.min(), mine.max()
    return names[low] if low == high else engine.DtypeCodes(names, mine)


def evaluate(points: pd.DataFrame, progress: bool = False) -> pd.DataFrame:
    """Outputs for each row of `points` (same order, fresh RangeIndex). Pure: chunks evaluate alike.

    `hw` and `model` cells are names or file paths; only INPUT_COLUMNS are read."""
    from hwmodels import load_device
    from tqdm import tqdm
    points = points.reset_index(drop=True)
    kinds = {"fits": bool, "max_batch": np.int64, "max_batch_all_at_once": np.int64, "decode_bound": object,
             "exceeds_max_positions": bool}
    n = len(points)
    devices, specs = {}, {}
    # the points sorted by group (stable: a group's points keep their order), so each group is a slice of
    # plain numpy columns (views, no per-group gathers) and its outputs land in one slice; unsorted at the end
    group = points.groupby(GROUP_COLUMNS, sort=False)
    number = group.ngroup().to_numpy()                 # -1: a key with a missing cell, not evaluated
    order = np.argsort(number, kind="stable")
    counts = group.size()                               # indexed by key in ngroup's numbering
    bounds = np.concatenate([[0], np.cumsum(counts.to_numpy())]) + int((number < 0).sum())
    cols = {c: points[c].to_numpy()[order] for c in ("batch", "prompt", "gen", "cache_ratio", "recent_ratio", "beams")}
    dtypes = {}                                         # a dtype column: its distinct names, each point's index
    for c in ("kv_dtype", "weight_dtype"):
        codes, names = pd.factorize(points[c], use_na_sentinel=False)   # a missing cell: the name "nan", refused
        dtypes[c] = (tuple(str(name) for name in names), codes[order])
    out = {c: np.empty(n, dtype=kinds.get(c, float)) for c in OUTPUT_COLUMNS}
    # disable=None: the bar shows on a terminal only, never in logs
    for j, key in enumerate(tqdm(list(counts.index), desc="sweep", unit="group",
                                 disable=None if progress else True, file=sys.stderr)):
        hw_name, model_name, policy, profile = key
        if hw_name not in devices:
            devices[hw_name] = load_device(hw_name)
        if model_name not in specs:
            specs[model_name] = load_model(model_name)
        hw, spec = devices[hw_name], specs[model_name]
        part = slice(bounds[j], bounds[j + 1])
        g = {c: v[part] for c, v in cols.items()}
        r = engine.evaluate(hw, spec, policy, batch=g["batch"], prompt=g["prompt"], gen=g["gen"],
                            cache_ratio=g["cache_ratio"], recent_ratio=g["recent_ratio"], beams=g["beams"],
                            kv_dtype=_dtypes(*dtypes["kv_dtype"], part),
                            weight_dtype=_dtypes(*dtypes["weight_dtype"], part), profile=profile)
        size = part.stop - part.start
        r["device_memory_bytes"] = np.full(size, float(hw.memory_bytes))
        total = g["prompt"] + g["gen"]
        r["exceeds_max_positions"] = total > spec.max_positions if spec.max_positions else np.zeros(size, bool)
        for col in OUTPUT_COLUMNS:
            out[col][part] = r[col]
    for col in OUTPUT_COLUMNS:                     # back to the points' order
        unsorted = np.empty_like(out[col])
        unsorted[order] = out[col]
        out[col] = unsorted
    return pd.DataFrame(out, index=points.index)
