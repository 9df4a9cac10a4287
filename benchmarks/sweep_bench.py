"""How fast does the analytic sweep go? Points/s in-process, on local worker processes and on a local
Dask cluster, plus the result cache's cold (compute + store) and warm (all hits) rates.

    python benchmarks/sweep_bench.py --points 10000000
    python benchmarks/sweep_bench.py --points 1000000 --modes local,dask --cache-points 200000

The grid is a real `sim.sweep` grid (every shipped datasheet device x models x policies x cache
ratios x batches x prompts x gens, cut to --points rows) evaluated by `sim.sweep.evaluate` through
`sim.runner`, exactly as `python -m sim.sweep` runs it. Results go to stdout as a table and to --out
as JSON (written atomically). The machine's core count and load average are recorded with them:
on a shared machine they explain most of the spread between runs.
"""
from __future__ import annotations

import json
import os
import platform
import resource
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(REPO))

import pandas as pd  # noqa: E402

from kvcommon.cli import OneLineParser  # noqa: E402
from sim import runner, sweep  # noqa: E402

MODES = ("local", "processes", "dask")


def bench_grid(n_points: int) -> pd.DataFrame:
    """A sweep grid of at least n_points (cartesian product of real axes), cut to n_points rows.

    The batch axis is widened until the product is large enough, so every row is a distinct point."""
    devices = sweep.datasheet_devices()
    models = ["llama-2-7b", "llama-3-8b", "mpt-7b", "gpt-j-6b"]
    ratios = [round(0.1 * i, 1) for i in range(1, 11)]
    prompts, gens = [512, 1024, 2048, 4096, 8192], [128, 256, 512, 1024]
    fixed = len(devices) * len(models) * 5 * len(ratios) * len(prompts) * len(gens)
    n_batches = max(1, -(-n_points // fixed))
    config = sweep.GridConfig(hw=devices, models=models, cache_ratios=ratios, prompts=prompts, gens=gens,
                              batches=list(range(1, n_batches + 1)))
    grid = sweep.build_grid(config)
    return grid.iloc[:n_points].reset_index(drop=True)


def key_columns(points: pd.DataFrame) -> list[str]:
    return sweep.cache_key_columns(points)   # exactly what `python -m sim.sweep` keys its cache on


def timed_run(points, executor, cache_dir=None, progress=True, desc="") -> dict:
    start = time.perf_counter()
    result = runner.run_points(points, sweep.evaluate, key_columns=key_columns(points), cache_dir=cache_dir,
                               executor=executor, collect=False, progress=progress, desc=desc,
                               eval_columns=sweep.INPUT_COLUMNS)
    seconds = time.perf_counter() - start
    return {"points": len(points), "computed": result.n_computed, "cached": result.n_cached,
            "seconds": round(seconds, 3), "points_per_s": round(len(points) / seconds, 1),
            "executor": result.executor, "chunk_size": result.chunk_size}


def cpu_seconds() -> float:
    """User + system CPU of this process and its finished children (worker processes, once reaped)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def run_mode(mode: str, points: pd.DataFrame, workers: int, progress: bool) -> dict:
    """Wall-clock points/s, and points per CPU-second: on a machine shared with other jobs the wall
    rate depends on their load, the CPU rate much less."""
    cpu0 = cpu_seconds()
    row = _run_mode(mode, points, workers, progress)
    cpu = cpu_seconds() - cpu0
    row["cpu_s"] = round(cpu, 2)
    row["points_per_cpu_s"] = round(len(points) / cpu, 1) if cpu > 0 else None
    return row


def _run_mode(mode: str, points: pd.DataFrame, workers: int, progress: bool) -> dict:
    if mode == "local":
        return timed_run(points, runner.LocalExecutor(), progress=progress, desc="local")
    if mode == "processes":
        return timed_run(points, runner.ProcessExecutor(workers), progress=progress, desc=f"{workers} processes")
    if mode == "dask":
        from distributed import LocalCluster
        started = time.perf_counter()
        with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
            startup = time.perf_counter() - started
            executor = runner.DaskExecutor(cluster.scheduler_address)
            try:
                row = timed_run(points, executor, progress=progress, desc=f"dask {workers} workers")
            finally:
                executor.close()
        row["cluster_startup_s"] = round(startup, 2)
        return row
    raise ValueError(f"unknown mode {mode!r}; expected {', '.join(MODES)}")


def main(argv=None) -> int:
    p = OneLineParser(description=__doc__.split("\n")[0])
    p.add_argument("--points", type=int, default=10_000_000, help="design points per mode (default 10M)")
    p.add_argument("--modes", default="local,processes,dask", help=f"comma-separated, from {', '.join(MODES)}")
    p.add_argument("--workers", type=int, default=2, help="processes / Dask workers (default 2)")
    p.add_argument("--cache-points", type=int, default=200_000,
                   help="points for the cold/warm cache measurement (0: skip)")
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    p.add_argument("--no-progress", action="store_true")
    a = p.parse_args(argv)
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or a.points < 1 or a.workers < 1:
        print(f"error: bad arguments: modes {bad or 'ok'}, points {a.points}, workers {a.workers}", file=sys.stderr)
        return 2

    started = time.perf_counter()
    points = bench_grid(a.points)
    grid_s = time.perf_counter() - started
    print(f"grid: {len(points):,} points built in {grid_s:.1f} s", file=sys.stderr)
    report = {"created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": {"cpus": os.cpu_count(), "load_avg_before": os.getloadavg(),
                          "python": platform.python_version(), "platform": platform.platform()},
              "env": {"OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY")},
              "code_version": runner.code_version(), "grid_points": len(points), "grid_build_s": round(grid_s, 2),
              "runs": {}}
    for mode in modes:
        row = run_mode(mode, points, a.workers, not a.no_progress)
        row["load_avg_after"] = os.getloadavg()
        report["runs"][mode] = row
        print(f"{mode:>10}: {row['points']:,} points in {row['seconds']:.1f} s = {row['points_per_s']:,.0f} points/s"
              f" wall, {row['points_per_cpu_s'] or float('nan'):,.0f} points per CPU-second "
              f"({row['executor']}, chunks of {row['chunk_size']:,})", file=sys.stderr)
    if a.cache_points:
        subset = points.iloc[:a.cache_points]
        with tempfile.TemporaryDirectory() as cache_dir:
            cold = timed_run(subset, runner.LocalExecutor(), cache_dir=cache_dir, progress=not a.no_progress,
                             desc="cache cold")
            warm = timed_run(subset, runner.LocalExecutor(), cache_dir=cache_dir, progress=not a.no_progress,
                             desc="cache warm")
        report["runs"]["cache_cold"], report["runs"]["cache_warm"] = cold, warm
        print(f"     cache: {len(subset):,} points cold {cold['points_per_s']:,.0f} points/s (compute + store), "
              f"warm {warm['points_per_s']:,.0f} points/s ({warm['cached']:,} hits, {warm['computed']} computed)",
              file=sys.stderr)
    report["total_s"] = round(time.perf_counter() - started, 1)
    text = json.dumps(report, indent=2)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = a.out.with_name(a.out.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, a.out)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
