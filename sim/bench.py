"""`python -m sim.bench --points N`: how many design points per second the analytic engine evaluates.

Draws N random points (device, model, policy, batch, beams, prompt, gen, cache/recent ratio, dtypes)
and evaluates them through sim.sweep.evaluate, the same path a sweep takes, capacity included. The
last line printed is `points_per_s=<number>` so scripts can read it. A benchmark, not a test. By default
the engine calls are spread over every core this process may use (`--workers 1`: one process, the
single-core rate); the line before the last says how many processes ran.
The library's one benchmark (installed, `kvsim bench`); one-off scripts live in benchmarks/ (its README).
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import numpy as np
import pandas as pd

from sim.cli import ArgumentParser, non_negative_int, positive_int, progress_disabled, run
from sim.policies import NAMES as POLICIES

BENCH_MODELS = ("llama-2-7b", "llama-3-8b", "mpt-7b", "gpt-j-6b", "llama-2-70b", "mistral-7b")
DTYPE_CHOICES = ("bf16", "fp16", "fp8", "int8")
# The points are drawn up front, about 200 bytes each (plus the chunk's evaluation): 1e8 is ~20 GB.
MAX_POINTS = 100_000_000


def point_count(text: str) -> int:
    """--points: a whole number >= 1, also written 1e6 or 1_000_000 (as the help writes it), <= MAX_POINTS."""
    try:
        value = float(text.replace("_", ""))
    except ValueError:
        value = float("nan")
    if not (value >= 1 and value == int(value)):
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1 (e.g. 1e6), got {text!r}")
    if value > MAX_POINTS:
        raise argparse.ArgumentTypeError(f"at most {MAX_POINTS:.0e} points (all are drawn before timing, about "
                                         f"200 bytes each), got {text!r}")
    return int(value)


def device_list(text: str) -> list[str]:
    """--hw: comma-separated device names; an empty list is a mistake, not "all devices"."""
    devices = [d.strip() for d in text.split(",") if d.strip()]
    if not devices:
        raise argparse.ArgumentTypeError(f"expected comma-separated device names, got {text!r} "
                                         "(leave --hw out for every datasheet device)")
    return devices


def random_points(n: int, seed: int = 0, devices=None) -> pd.DataFrame:
    """N random design points over the shipped datasheet devices and a few models."""
    from sim.sweep import datasheet_devices
    rng = np.random.default_rng(seed)
    devices = list(devices or datasheet_devices())
    pick = lambda options: np.asarray(options, dtype=object)[rng.integers(0, len(options), n)]
    return pd.DataFrame({
        "hw": pick(devices), "model": pick(BENCH_MODELS), "policy": pick(POLICIES),
        "cache_ratio": rng.uniform(0.05, 1.0, n), "recent_ratio": rng.uniform(0.0, 0.5, n),
        "batch": rng.integers(1, 257, n), "beams": pick([1, 1, 1, 2, 4]).astype(int),
        "prompt": rng.integers(64, 32769, n), "gen": rng.integers(1, 8193, n),
        "kv_dtype": pick(DTYPE_CHOICES), "weight_dtype": pick(DTYPE_CHOICES), "profile": "fused",
    })


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m sim.bench", description=__doc__.split("\n")[0])
    p.add_argument("--points", type=point_count, default=1_000_000,
                   help=f"design points to evaluate, 1 to {MAX_POINTS:.0e} (default 1e6)")
    # one call per million points: each (device, model, policy, profile) group is then 4x larger than at
    # 250k, and a group's fixed cost (building and timing its operator tables) is paid 4x less often;
    # peak RSS at 1e6 points is about 0.8 GB (docs/performance.md)
    p.add_argument("--chunk", type=positive_int, default=1_000_000,
                   help="points per evaluate() call (default 1e6; smaller chunks pay the per-group cost more often)")
    p.add_argument("--seed", type=non_negative_int, default=0, help="random seed of the points")
    p.add_argument("--hw", type=device_list, help="comma-separated devices (default: all datasheet devices)")
    p.add_argument("--workers", type=positive_int, default=None,
                   help="processes evaluating at once (default: the cores this process may use; 1: this process "
                        "alone, the engine's single-core rate)")
    return p


def main(argv=None) -> int:
    from tqdm import tqdm
    from sim.runner.forked import can_fork, usable_cores
    from sim.sweep import evaluate
    a = build_parser().parse_args(argv)
    workers = (a.workers or usable_cores()) if can_fork() else 1
    points = random_points(a.points, a.seed, a.hw)
    evaluate(points.head(64))                      # warm-up: device files, model specs, imports
    t0 = time.perf_counter()
    done = 0
    with tqdm(total=len(points), unit="pt", unit_scale=True, file=sys.stderr, disable=progress_disabled()) as bar:
        for start in range(0, len(points), a.chunk):
            chunk = points.iloc[start:start + a.chunk]
            out = evaluate(chunk, workers=workers)
            done += len(out)
            bar.update(len(out))
    elapsed = time.perf_counter() - t0
    rate = done / elapsed
    from sim.sweep.analytic import parallel_workers
    used = parallel_workers(min(a.chunk, len(points)), workers)            # what evaluate() ran on
    processes = "one process" if used == 1 else f"{used} processes"
    print(f"{done:,} points in {elapsed:.2f} s on {platform.machine()} ({os.cpu_count()} cpus, {processes}): "
          f"{rate * 60:,.0f} points/minute")
    print(f"points_per_s={rate:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
