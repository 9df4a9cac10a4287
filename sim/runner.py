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
"""
from __future__ import annotations

import hashlib
import json
import math
import multiprocessing
import os
import queue
import signal
import sys
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm  # text bar on stderr everywhere (tqdm.auto wants ipywidgets in notebooks)

from hwmodels.cli import progress_disabled

REPO_ROOT = Path(__file__).resolve().parents[1]
# The packages whose source decides a simulated result; editing any of them starts a fresh cache.
CODE_PACKAGES = ("sim", "hwmodels", "traces")
KEY_HI, KEY_LO = "_key_hi", "_key_lo"
# Parallel chunks are capped so that an interruption loses little and progress moves often.
DEFAULT_MAX_CHUNK = 50_000
DASK_CONNECT_TIMEOUT = "10s"   # how long to wait for a Dask scheduler before a one-line error

Evaluate = Callable[[pd.DataFrame], pd.DataFrame]


# ---------------------------------------------------------------------------------------- identity

@lru_cache(maxsize=None)
def code_version(packages: tuple[str, ...] = CODE_PACKAGES) -> str:
    """Hash of every ``.py`` file of the simulator packages (paths and contents), plus the version.

    Conservative on purpose: any source edit invalidates cached results, since a cache that silently
    serves numbers from older code is worse than recomputing."""
    digest = hashlib.sha256()
    try:
        from importlib.metadata import version
        digest.update(version("kvsim").encode())
    except Exception:  # not installed (running from a checkout): the sources alone decide
        pass
    for package in packages:
        root = REPO_ROOT / package
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(REPO_ROOT).as_posix()
            if "/data/" in rel or "__pycache__" in rel:
                continue
            digest.update(rel.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def stable_hash(obj) -> str:
    """Hash of a JSON-able object, independent of dict order."""
    text = json.dumps(obj, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def function_name(fn: Callable) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _canonical_column(values: pd.Series) -> pd.Series:
    """Numbers as float64 rounded to 12 significant digits, everything else as text.

    So 1 and 1.0, or 0.1+0.2 and 0.3, name the same point: a grid rebuilt from a YAML file and one
    built with numpy then share cache entries."""
    if pd.api.types.is_bool_dtype(values) or pd.api.types.is_numeric_dtype(values):
        x = values.to_numpy(dtype=np.float64, na_value=np.nan)
        finite = np.isfinite(x) & (x != 0)
        out = x.copy()
        magnitude = np.floor(np.log10(np.abs(x[finite])))
        scale = 10.0 ** (11 - magnitude)
        out[finite] = np.round(x[finite] * scale) / scale
        out[x == 0] = 0.0  # -0.0 and 0.0 hash differently otherwise
        return pd.Series(out, index=values.index)
    return values.astype(str)


def point_keys(points: pd.DataFrame, key_columns: Sequence[str], salt: str) -> tuple[np.ndarray, np.ndarray]:
    """Two independent 64-bit hashes per row (a 128-bit key) of ``key_columns`` and ``salt``.

    Vectorised (pandas' row hashing), ~0.1 s per million rows, so keys are cheap even at 10^7 points."""
    missing = [c for c in key_columns if c not in points.columns]
    if missing:
        raise ValueError(f"key columns {missing} are not columns of the design points")
    columns = sorted(key_columns)
    frame = pd.DataFrame({c: _canonical_column(points[c]) for c in columns}, index=points.index)
    seed = hashlib.sha256((salt + "\0" + "\0".join(columns)).encode()).hexdigest()
    hi = pd.util.hash_pandas_object(frame, index=False, hash_key=seed[:16]).to_numpy(np.uint64)
    lo = pd.util.hash_pandas_object(frame, index=False, hash_key=seed[16:32]).to_numpy(np.uint64)
    return hi, lo


# ------------------------------------------------------------------------------------------- cache

class ResultCache:
    """Per-point results on disk, as immutable Parquet shards in one folder per (function, code, context)."""

    def __init__(self, root: str | os.PathLike, namespace: str):
        self.dir = Path(root) / namespace
        self.dir.mkdir(parents=True, exist_ok=True)
        self.unreadable: list[Path] = []     # shards load() could not read: replaced by drop_unreadable()

    def shards(self) -> list[Path]:
        return sorted(self.dir.glob("shard-*.parquet"))

    def load(self, wanted_hi: np.ndarray | None = None) -> pd.DataFrame:
        """All cached rows (optionally only those whose key is in ``wanted_hi``), one row per key."""
        frames = []
        for path in self.shards():
            try:
                frame = pd.read_parquet(path)
            except FileNotFoundError:  # compacted away by a concurrent run: its rows are in a new shard
                continue
            except Exception as exc:  # a shard can only be corrupt if edited by hand: recompute its points
                warnings.warn(f"ignoring unreadable cache shard {path}: {exc}; its points are recomputed "
                              "and the shard replaced")
                if path not in self.unreadable:
                    self.unreadable.append(path)
                continue
            frames.append(frame)
        if not frames:
            return pd.DataFrame({KEY_HI: np.array([], np.uint64), KEY_LO: np.array([], np.uint64)})
        table = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
        if wanted_hi is not None:  # one hash-table pass (pandas isin), not one per shard
            table = table[table[KEY_HI].isin(pd.Index(wanted_hi).unique())]
        return table.drop_duplicates([KEY_HI, KEY_LO], ignore_index=True)

    def store(self, hi: np.ndarray, lo: np.ndarray, outputs: pd.DataFrame) -> Path:
        """Write one finished chunk as a new shard, atomically (tmp file + rename)."""
        frame = outputs.reset_index(drop=True).copy()
        frame.insert(0, KEY_LO, np.asarray(lo, np.uint64))
        frame.insert(0, KEY_HI, np.asarray(hi, np.uint64))
        path = self.dir / f"shard-{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.parquet"
        _atomic_parquet(frame, path)
        return path

    def drop_unreadable(self) -> None:
        """Remove the unreadable shards load() met, once the run has stored its points in new shards
        (written atomically): nothing readable is lost, and the next run neither warns nor recomputes."""
        for path in self.unreadable:
            path.unlink(missing_ok=True)
        self.unreadable.clear()

    def compact(self, min_shards: int = 64) -> None:
        """Merge many small shards into one. The merged shard lands before the old ones go, so a crash
        in between leaves duplicates (harmless: ``load`` drops them), never a gap."""
        shards = self.shards()
        if len(shards) < min_shards:
            return
        frames, read = [], []
        for p in shards:
            try:
                frames.append(pd.read_parquet(p))
            except Exception:   # vanished (a concurrent compaction) or unreadable: load() warns about it
                continue
            read.append(p)
        if not frames:
            return
        merged = pd.concat(frames, ignore_index=True).drop_duplicates([KEY_HI, KEY_LO], ignore_index=True)
        _atomic_parquet(merged, self.dir / f"shard-{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.parquet")
        for p in read:
            p.unlink(missing_ok=True)


def _atomic_parquet(frame: pd.DataFrame, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    frame.to_parquet(tmp, index=False)
    os.replace(tmp, path)


# --------------------------------------------------------------------------------------- executors

def _call(evaluate: Evaluate, chunk_id: int, chunk: pd.DataFrame) -> tuple[int, pd.DataFrame]:
    return chunk_id, evaluate(chunk)


class LocalExecutor:
    """In this process, one chunk after another."""
    workers = 1

    def imap(self, evaluate: Evaluate, chunks: Iterator[tuple[int, pd.DataFrame]]):
        for chunk_id, chunk in chunks:
            yield _call(evaluate, chunk_id, chunk)

    def describe(self) -> str:
        return "local"


def _ignore_sigint() -> None:
    # Ctrl-C goes to the whole process group; the parent handles it and terminates the pool, so the
    # workers must not each print a KeyboardInterrupt traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class ProcessExecutor:
    """N local worker processes (spawned: no fork-with-threads hazards), at most 2 chunks in flight each."""

    def __init__(self, workers: int):
        if workers < 1:
            raise ValueError(f"--workers must be >= 1, got {workers}")
        self.workers = workers

    def describe(self) -> str:
        return f"{self.workers} local processes"

    def imap(self, evaluate: Evaluate, chunks: Iterator[tuple[int, pd.DataFrame]]):
        done: queue.Queue = queue.Queue()
        pool = multiprocessing.get_context("spawn").Pool(self.workers, initializer=_ignore_sigint)
        try:
            in_flight = 0
            for chunk_id, chunk in chunks:
                pool.apply_async(_call, (evaluate, chunk_id, chunk), callback=done.put,
                                 error_callback=done.put)
                in_flight += 1
                while in_flight >= 2 * self.workers:
                    yield _unwrap(done.get())
                    in_flight -= 1
            while in_flight:
                yield _unwrap(done.get())
                in_flight -= 1
            pool.close()
            pool.join()
        finally:
            pool.terminate()  # on an interrupt or error: stop the workers now, finished chunks are saved


def _unwrap(item):
    if isinstance(item, BaseException):
        raise item
    return item


class DaskExecutor:
    """A Dask distributed cluster (``ADDRESS`` of its scheduler, or a ``distributed.Client``).

    Workers need kvsim importable (``pip install kvsim`` there). Chunks are submitted through a
    bounded window (4 per worker thread), so a 10^7-point sweep never holds every chunk in the
    scheduler's memory."""

    def __init__(self, scheduler, connect_timeout: str | None = None):
        try:
            from distributed import Client
        except ImportError as exc:  # the optional 'scale' extra
            raise ValueError("--scheduler needs dask distributed: pip install 'kvsim[scale]'") from exc
        if isinstance(scheduler, Client):
            self.client, self._own_client = scheduler, False
        else:
            try:
                self.client = Client(scheduler, timeout=connect_timeout or DASK_CONNECT_TIMEOUT)
            except (OSError, TimeoutError) as exc:
                raise ValueError(f"cannot reach the Dask scheduler at {scheduler}: {exc}") from None
            self._own_client = True
        threads = sum(self.client.nthreads().values())
        self.workers = max(1, threads)

    def describe(self) -> str:
        return f"Dask cluster at {self.client.scheduler.address} ({self.workers} worker threads)"

    def imap(self, evaluate: Evaluate, chunks: Iterator[tuple[int, pd.DataFrame]]):
        from distributed import as_completed
        futures = as_completed()
        pending = []
        try:
            for chunk_id, chunk in chunks:
                future = self.client.submit(_call, evaluate, chunk_id, chunk, pure=False)
                pending.append(future)
                futures.add(future)
                # 4 per worker: enough queued that shipping inputs and results overlaps computing
                while futures.count() >= 4 * self.workers:
                    finished = next(futures)
                    pending.remove(finished)
                    yield finished.result()
            for finished in futures:
                pending.remove(finished)
                yield finished.result()
        finally:
            if pending:
                self.client.cancel(pending)

    def close(self) -> None:
        if self._own_client:
            self.client.close()


def make_executor(workers: int | None = None, scheduler=None):
    """``scheduler`` wins over ``workers``; neither means in-process."""
    if scheduler:
        return DaskExecutor(scheduler)
    if workers and workers > 1:
        return ProcessExecutor(workers)
    return LocalExecutor()


# ------------------------------------------------------------------------------------------ runner

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
