"""Run a pure, chunkable function over a table of design points: locally, on local processes or on
a Dask cluster, with a per-point result cache that makes every sweep resumable.

The contract with the caller (``sim.sweep`` and the benchmark):

- ``points`` is a DataFrame, one row per design point;
- ``evaluate(chunk) -> DataFrame`` is a module-level (picklable), pure function returning exactly one
  row per input row, in the same order;
- ``key_columns`` name the columns that identify a point. They must hold the *full* configuration:
  identities such as a device file's ``content_hash``, a model spec hash or a trace's manifest hash go
  in as columns (see ``sim.sweep``), so editing a device file invalidates exactly its points.
  ``context`` adds sweep-wide identity; the code version (a hash of the simulator's sources) and the
  evaluate function's name are always part of the key.

Cache layout: ``<cache_dir>/<function>-<hash of code version + context>/shard-*.parquet``, each shard
holding the 128-bit point keys (two uint64 columns) and the outputs of one finished chunk. A shard is
written to ``name.tmp`` and renamed into place, so a sweep killed at any moment leaves only whole
shards: a rerun loads them, computes only the points no shard holds, and never computes a point twice
(duplicate points within one sweep are computed once, too). At most one chunk per worker is lost to an
interruption; chunks are sized so that is a second or two of work.

Modules: identity (code version, point keys), cache (ResultCache), executors (local, processes, Dask),
forked (one computation's pieces on forked processes, results in shared memory: sim.sweep.evaluate's workers);
this package holds the run loop (`run_points`) and re-exports the rest.
"""
from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm  # text bar on stderr everywhere (tqdm.auto wants ipywidgets in notebooks)

from hwmodels.cli import progress_disabled
from sim.runner.cache import KEY_HI, KEY_LO, ResultCache
from sim.runner.executors import (DASK_CONNECT_TIMEOUT, DaskExecutor, Evaluate, LocalExecutor, ProcessExecutor,
                                  make_executor)
from sim.runner.identity import CODE_PACKAGES, REPO_ROOT, code_version, function_name, point_keys, stable_hash

__all__ = ["CODE_PACKAGES", "DASK_CONNECT_TIMEOUT", "DEFAULT_MAX_CHUNK", "DaskExecutor", "LocalExecutor",
           "ProcessExecutor", "REPO_ROOT", "ResultCache", "RunResult", "choose_chunk_size", "code_version",
           "function_name", "make_executor", "point_keys", "run_points", "stable_hash"]

# Parallel chunks are capped so that an interruption loses little and progress moves often.
DEFAULT_MAX_CHUNK = 50_000


@dataclass
class RunResult:
    table: pd.DataFrame | None       # outputs, one row per input point in input order (None if not collected)
    n_points: int
    n_cached: int                    # served from the cache
    n_computed: int                  # evaluated by this run (unique points)
    seconds: float
    executor: str
    cache_dir: Path | None = None
    chunk_size: int = 0

    @property
    def points_per_s(self) -> float:
        return self.n_computed / self.seconds if self.seconds > 0 else float("nan")


def choose_chunk_size(n_points: int, workers: int, max_chunk: int = DEFAULT_MAX_CHUNK) -> int:
    """About 8 chunks per worker (load balance, smooth progress), never more than ``max_chunk``."""
    if n_points <= 0:
        return 1
    return int(max(1, min(max_chunk, math.ceil(n_points / (8 * max(1, workers))))))


def run_points(points: pd.DataFrame, evaluate: Evaluate, *, key_columns: Sequence[str] | None = None,
               context: Mapping | None = None, cache_dir: str | os.PathLike | None = None,
               executor=None, chunk_size: int | None = None, max_chunk: int = DEFAULT_MAX_CHUNK,
               collect: bool = True, progress: bool = True, desc: str = "points",
               eval_columns: Sequence[str] | None = None) -> RunResult:
    """Evaluate every point not already cached; return all outputs in the order of ``points``.

    ``eval_columns``: the only columns ``evaluate`` reads (default all); chunks shipped to worker
    processes or a cluster then carry just those."""
    start = time.perf_counter()
    executor = executor or LocalExecutor()
    points = points.reset_index(drop=True)
    n = len(points)
    key_columns = list(key_columns) if key_columns is not None else list(points.columns)

    cache = None
    if cache_dir is not None:
        salt = stable_hash({"code": code_version(), "function": function_name(evaluate),
                            "context": dict(context or {})})
        name = getattr(evaluate, "__name__", "evaluate")
        cache = ResultCache(cache_dir, f"{name}-{salt[:12]}")
        hi, lo = point_keys(points, key_columns, salt)
        cached = cache.load(hi)
        where = _lookup(cached, hi, lo)
        todo_rows = np.flatnonzero(where < 0)
        # Duplicate points in the grid: compute each once.
        repeated = pd.DataFrame({KEY_HI: hi[todo_rows], KEY_LO: lo[todo_rows]}).duplicated().to_numpy()
        todo_rows = todo_rows[~repeated]
    else:
        hi = lo = None
        cached = None
        where = np.full(n, -1)
        todo_rows = np.arange(n)

    n_cached = int((where >= 0).sum())
    size = chunk_size or choose_chunk_size(len(todo_rows), executor.workers, max_chunk)
    # SI-scaled counts (1.2M) only where they help: "14.0/14.0" reads worse than "14/14"
    bar = tqdm(total=n, initial=n_cached, unit="pt", unit_scale=n >= 100_000, smoothing=0.05, desc=desc,
               file=sys.stderr, disable=progress_disabled(progress), dynamic_ncols=True)
    if n_cached:
        bar.set_postfix_str(f"{n_cached:,} cached")

    shipped = points[list(eval_columns)] if eval_columns is not None else points

    def chunks():
        for chunk_id, lo_i in enumerate(range(0, len(todo_rows), size)):
            yield chunk_id, shipped.iloc[todo_rows[lo_i:lo_i + size]]

    new_parts: dict[int, pd.DataFrame] = {}
    n_computed = 0
    try:
        for chunk_id, out in executor.imap(evaluate, chunks()):
            rows = todo_rows[chunk_id * size:(chunk_id + 1) * size]
            if not isinstance(out, pd.DataFrame) or len(out) != len(rows):
                got = len(out) if isinstance(out, pd.DataFrame) else type(out).__name__
                raise RuntimeError(f"{function_name(evaluate)} returned {got} rows for {len(rows)} points")
            out = out.reset_index(drop=True)
            if cache is not None:
                cache.store(hi[rows], lo[rows], out)
            if collect:
                new_parts[chunk_id] = out
            n_computed += len(rows)
            bar.update(len(rows))
    finally:
        bar.close()
    if cache is not None:
        cache.drop_unreadable()   # their points (those this run wanted) are in this run's new shards
        cache.compact()

    table = None
    if collect:
        table = _assemble(n, hi, lo, cached, todo_rows, new_parts)
    return RunResult(table=table, n_points=n, n_cached=n_cached, n_computed=n_computed,
                     seconds=time.perf_counter() - start, executor=executor.describe(),
                     cache_dir=cache.dir if cache else None, chunk_size=size)


def _lookup(cached: pd.DataFrame, hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """Row of ``cached`` holding each (hi, lo) key, or -1."""
    if cached is None or cached.empty:
        return np.full(len(hi), -1)
    c_hi = cached[KEY_HI].to_numpy(np.uint64)
    index = pd.Index(c_hi)
    if index.is_unique:
        where = index.get_indexer(hi)
        found = where >= 0
        # The second 64 bits must match too; otherwise it is a (vanishingly rare) collision: recompute.
        where[found & (cached[KEY_LO].to_numpy(np.uint64)[np.where(found, where, 0)] != lo)] = -1
        return where
    # Two different points share the first 64 bits: fall back to an exact join on all 128.
    left = pd.DataFrame({KEY_HI: hi, KEY_LO: lo, "_row": np.arange(len(hi))})
    right = pd.DataFrame({KEY_HI: c_hi, KEY_LO: cached[KEY_LO].to_numpy(np.uint64), "_at": np.arange(len(c_hi))})
    merged = left.merge(right, how="left", on=[KEY_HI, KEY_LO]).sort_values("_row")
    return merged["_at"].fillna(-1).to_numpy(np.int64)


def _assemble(n, hi, lo, cached, todo_rows, new_parts) -> pd.DataFrame:
    """Outputs in input order: cached rows and this run's chunks, looked up by point key."""
    computed = [new_parts[i] for i in sorted(new_parts)]
    if hi is None:  # no cache: the chunks are the points, in order
        return pd.concat(computed, ignore_index=True) if computed else pd.DataFrame(index=range(n))
    frames = []
    if cached is not None and not cached.empty:
        frames.append(cached)
    if computed:
        new = pd.concat(computed, ignore_index=True)
        new.insert(0, KEY_LO, lo[todo_rows])
        new.insert(0, KEY_HI, hi[todo_rows])
        frames.append(new)
    if not frames:
        return pd.DataFrame(index=range(n))
    every = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    every = every.drop_duplicates([KEY_HI, KEY_LO], ignore_index=True)
    rows = _lookup(every, hi, lo)
    if (rows < 0).any():  # cannot happen unless the cache changed under us
        raise RuntimeError(f"{int((rows < 0).sum())} points have no result")
    return every.iloc[rows].drop(columns=[KEY_HI, KEY_LO]).reset_index(drop=True)
