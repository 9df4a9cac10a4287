"""The analytic engine over a table of design points: `evaluate(points)`, one output row per point."""
from __future__ import annotations

import sys

import numpy as np
import pandas as pd

from sim import engine, policies
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
    kinds = {"fits": bool, "max_batch": np.int64, "max_batch_all_at_once": np.int64, "exceeds_max_positions": bool}
    n = len(points)
    devices, specs = {}, {}
    # the points sorted by group (stable: a group's points keep their order), so each group is a slice of
    # plain numpy columns (views, no per-group gathers); its outputs scatter back to its points' rows
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
    # outputs in the points' own order: each group scatters into its points' rows (one pass per column);
    # decode_bound is derived once at the end from the two times it compares (latency: memory >= compute)
    numeric = [c for c in OUTPUT_COLUMNS if c != "decode_bound"]
    out = {c: np.empty(n, dtype=kinds.get(c, float)) for c in numeric}
    # disable=None: the bar shows on a terminal only, never in logs
    for j, key in enumerate(tqdm(list(counts.index), desc="sweep", unit="group",
                                 disable=None if progress else True, file=sys.stderr)):
        hw_name, model_name, policy, profile = key
        if hw_name not in devices:
            devices[hw_name] = load_device(hw_name)
        if model_name not in specs:
            specs[model_name] = load_model(model_name)
        hw, spec = devices[hw_name], specs[model_name]
        for part in blocks(bounds[j], bounds[j + 1], block_points(policy)):
            g = {c: v[part] for c, v in cols.items()}
            r = engine.evaluate(hw, spec, policy, batch=g["batch"], prompt=g["prompt"], gen=g["gen"],
                                cache_ratio=g["cache_ratio"], recent_ratio=g["recent_ratio"], beams=g["beams"],
                                kv_dtype=_dtypes(*dtypes["kv_dtype"], part),
                                weight_dtype=_dtypes(*dtypes["weight_dtype"], part), profile=profile)
            rows = order[part]
            r["device_memory_bytes"] = float(hw.memory_bytes)
            r["exceeds_max_positions"] = (g["prompt"] + g["gen"] > spec.max_positions) if spec.max_positions else False
            for col in numeric:
                out[col][rows] = r[col]
    out["decode_bound"] = bound_labels(out["decode_memory_time_s"] >= out["decode_compute_time_s"])
    # copy=False: the columns are fresh arrays of this call; pandas keeps them instead of consolidating
    return pd.DataFrame({c: out[c] for c in OUTPUT_COLUMNS}, index=points.index, copy=False)


# Points per engine call for a larger group: a group is evaluated in blocks of about this many points
# (an evicting policy's tables have one decode node per point, a growing cache's nine). Measured on a
# 1M-point single-device sweep (docs/performance.md): whole 16,700-point groups and 4,000-point blocks
# spend a third of their time in page faults (their multi-MB temporaries are returned to the OS and
# faulted back every call: ~900k minor faults), 2,000 / 1,200-point blocks almost none, and 1,000-point
# blocks pay the engine's fixed cost per call too often. Groups below 1.5 blocks stay whole.
BLOCK_POINTS = {"evicting": 2000, "growing": 1200}


def block_points(policy: str) -> int:
    return BLOCK_POINTS["evicting" if policies.get(policy).evicts else "growing"]


def blocks(start: int, stop: int, size: int) -> list[slice]:
    """[start, stop) cut into the number of near-equal slices closest to blocks of `size` points (one
    slice below 1.5 x size)."""
    count = max(1, round((stop - start) / size))
    edges = np.linspace(start, stop, count + 1).round().astype(int)
    return [slice(a, b) for a, b in zip(edges[:-1], edges[1:])]


def bound_labels(memory_bound: np.ndarray):
    """"memory" / "compute" per point as the column pandas would infer from those strings (the same dtype
    and values), built by one take from two labels where pandas stores strings in Arrow."""
    labels = np.array(["compute", "memory"], dtype=object)
    target = pd.Series(labels).dtype
    if getattr(target, "storage", None) == "pyarrow":
        import pyarrow as pa
        return pd.array(pa.array(labels.tolist()).take(pa.array(memory_bound.astype(np.int8))), dtype=target)
    return labels[memory_bound.astype(np.intp)]
