"""The analytic engine over a table of design points: `evaluate(points)`, one output row per point."""
from __future__ import annotations

import sys

import numpy as np
import pandas as pd

from sim import engine, policies
from sim.models import load_model
from sim.runner.forked import SharedCounter, run_forked, shared_empty
from sim.sweep.grid import GROUP_COLUMNS

OUTPUT_COLUMNS = ["ttft_s", "tpot_s", "e2e_s", "tokens_per_s", "peak_memory_bytes", "fits", "max_batch",
                  "max_batch_tokens_per_s", "max_batch_tpot_s", "max_batch_all_at_once",
                  "max_batch_all_at_once_tokens_per_s", "decode_bound", "decode_kv_read_bytes",
                  "decode_memory_time_s", "decode_compute_time_s", "kv_bytes_per_token", "peak_kv_tokens",
                  "weight_bytes", "device_memory_bytes", "exceeds_max_positions"]


def _dtypes(names: tuple, codes: np.ndarray, rows: np.ndarray):
    """A call's dtypes: one name when all its points share it (the engine's scalar fast path), else codes."""
    mine = codes[rows]
    low, high = mine.min(), mine.max()
    return names[low] if low == high else engine.DtypeCodes(names, mine)


def evaluate(points: pd.DataFrame, progress: bool = False, workers: int = 1) -> pd.DataFrame:
    """Outputs for each row of `points` (same order, fresh RangeIndex). Pure: chunks evaluate alike.

    `hw` and `model` cells are names or file paths; only INPUT_COLUMNS are read. `workers` > 1 spreads
    the engine calls over that many processes (forked, sim.runner.forked) when there are at least
    PARALLEL_MIN_POINTS points: the same calls on the same numbers, so the same outputs, bit for bit."""
    from tqdm import tqdm
    points = points.reset_index(drop=True)
    kinds = {"fits": bool, "max_batch": np.int64, "max_batch_all_at_once": np.int64, "exceeds_max_positions": bool}
    n = len(points)
    # the points sorted by group (stable: a group's points keep their order): a group is a slice of `order`,
    # each call gathers its points' inputs by it (in the worker that runs it) and scatters its outputs back
    group = points.groupby(GROUP_COLUMNS, sort=False)
    number = group.ngroup().to_numpy()                 # -1: a key with a missing cell, not evaluated
    # stable argsort of small integers is a radix sort (the same order as the int64 merge sort, faster)
    order = np.argsort(number.astype(np.int16) if number.max(initial=0) < 2 ** 15 else number, kind="stable")
    counts = group.size()                               # indexed by key in ngroup's numbering
    bounds = np.concatenate([[0], np.cumsum(counts.to_numpy())]) + int((number < 0).sum())
    cols = {c: points[c].to_numpy() for c in ("batch", "prompt", "gen", "cache_ratio", "recent_ratio", "beams")}
    dtypes = {}                                         # a dtype column: its distinct names, each point's index
    for c in ("kv_dtype", "weight_dtype"):
        codes, names = pd.factorize(points[c], use_na_sentinel=False)   # a missing cell: the name "nan", refused
        dtypes[c] = (tuple(str(name) for name in names), codes)
    keys = list(counts.index)
    calls = [(j, part) for j, key in enumerate(keys)    # one engine call per block of a group
             for part in blocks(bounds[j], bounds[j + 1], block_points(key[2]))]
    workers = min(parallel_workers(n, workers), max(1, len(calls)))
    # outputs in the points' own order: each call scatters into its points' rows (one pass per column);
    # decode_bound is derived once at the end from the two times it compares (latency: memory >= compute)
    numeric = [c for c in OUTPUT_COLUMNS if c != "decode_bound"]
    empty = shared_empty if workers > 1 else np.empty
    out = {c: empty(n, dtype=kinds.get(c, float)) for c in numeric}
    devices, specs = {}, {}

    def run_call(i: int) -> None:
        """Engine call i, its outputs scattered into `out`."""
        from hwmodels import load_device
        j, part = calls[i]
        hw_name, model_name, policy, profile = keys[j]
        if hw_name not in devices:
            devices[hw_name] = load_device(hw_name)
        if model_name not in specs:
            specs[model_name] = load_model(model_name)
        hw, spec = devices[hw_name], specs[model_name]
        rows = order[part]
        g = {c: v[rows] for c, v in cols.items()}
        r = engine.evaluate(hw, spec, policy, batch=g["batch"], prompt=g["prompt"], gen=g["gen"],
                            cache_ratio=g["cache_ratio"], recent_ratio=g["recent_ratio"], beams=g["beams"],
                            kv_dtype=_dtypes(*dtypes["kv_dtype"], rows),
                            weight_dtype=_dtypes(*dtypes["weight_dtype"], rows), profile=profile)
        r["device_memory_bytes"] = float(hw.memory_bytes)
        r["exceeds_max_positions"] = (g["prompt"] + g["gen"] > spec.max_positions) if spec.max_positions else False
        for col in numeric:
            out[col][rows] = r[col]

    # disable=None: the bar shows on a terminal only, never in logs
    bar = lambda it, total: tqdm(it, total=total, desc="sweep", unit="call", disable=None if progress else True,
                                 file=sys.stderr)
    if workers == 1:
        for i in bar(range(len(calls)), len(calls)):
            run_call(i)
    else:
        _run_parallel(run_call, _by_cost(calls, keys), workers, bar)
    out["decode_bound"] = bound_labels(out["decode_memory_time_s"] >= out["decode_compute_time_s"])
    # copy=False: the columns are fresh arrays of this call; pandas keeps them instead of consolidating
    return pd.DataFrame({c: out[c] for c in OUTPUT_COLUMNS}, index=points.index, copy=False)


# Below this many points a sweep stays in one process whatever `workers` says: a fork costs ~10-30 ms.
PARALLEL_MIN_POINTS = 50_000


def parallel_workers(points: int, workers: int) -> int:
    """The processes evaluate() runs `points` points on when asked for `workers` (at most that many calls)."""
    return max(1, int(workers)) if points >= PARALLEL_MIN_POINTS else 1
# Relative cost of an engine call (docs/performance.md: ~1.5 ms fixed, then ~2.5 us per point of an
# evicting policy, ~7 us of a growing cache): the workers take the dearest calls first, so the last
# calls, when one worker may already be idle, are short ones.
CALL_FIXED_S, POINT_S = 1.5e-3, {"evicting": 2.5e-6, "growing": 7e-6}


def _by_cost(calls: list, keys: list) -> list[int]:
    cost = [CALL_FIXED_S + (part.stop - part.start) * POINT_S[_kind(keys[j][2])] for j, part in calls]
    return sorted(range(len(calls)), key=lambda i: -cost[i])


def _run_parallel(run_call, queue: list[int], workers: int, bar) -> None:
    """run_call(i) for every i of `queue` on `workers` processes, each taking the next i as it finishes one
    (the parent's bar counts every worker's calls). A failed call does not stop the others, so the error
    raised is the one of the lowest call index: what one process, going in call order, raises first."""
    counter = SharedCounter()

    def worker(k: int):
        failure = None
        progress = bar(None, len(queue)) if k == 0 else None
        while (taken := counter.take()) < len(queue):
            i = queue[taken]
            try:
                run_call(i)
            except Exception as exc:
                if failure is None or i < failure[0]:
                    failure = (i, exc)
            if progress is not None:
                progress.n = min(taken + 1, len(queue))
                progress.refresh()
        if progress is not None:
            progress.close()
        return failure

    failures = [f for f in run_forked(worker, workers) if f is not None]
    if failures:
        raise min(failures, key=lambda f: f[0])[1]


# Points per engine call for a larger group: a group is evaluated in blocks of about this many points
# (an evicting policy's tables have one decode node per point, a growing cache's nine). Measured on a
# 1M-point single-device sweep (docs/performance.md): whole 16,700-point groups and 4,000-point blocks
# spend a third of their time in page faults (their multi-MB temporaries are returned to the OS and
# faulted back every call: ~900k minor faults), 2,000 / 1,200-point blocks almost none, and 1,000-point
# blocks pay the engine's fixed cost per call too often. Groups below 1.5 blocks stay whole.
BLOCK_POINTS = {"evicting": 2000, "growing": 1200}


def _kind(policy: str) -> str:
    return "evicting" if policies.get(policy).evicts else "growing"


def block_points(policy: str) -> int:
    return BLOCK_POINTS[_kind(policy)]


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
