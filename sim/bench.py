"""`python -m sim.bench --points N`: how many design points per second the analytic engine evaluates.

Draws N random points (device, model, policy, batch, beams, prompt, gen, cache/recent ratio, dtypes)
and evaluates them through sim.sweep.evaluate, the same path a sweep takes, capacity included. The
last line printed is `points_per_s=<number>` so scripts can read it. A benchmark, not a test.
The library's one benchmark (installed, `kvsim bench`); one-off scripts live in benchmarks/ (its README).
"""
from __future__ import annotations

import os
import platform
import sys
import time

import numpy as np
import pandas as pd

from sim.cli import ArgumentParser, positive_int, run
from sim.policies import NAMES as POLICIES

BENCH_MODELS = ("llama-2-7b", "llama-3-8b", "mpt-7b", "gpt-j-6b", "llama-2-70b", "mistral-7b")
DTYPE_CHOICES = ("bf16", "fp16", "fp8", "int8")


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
    p.add_argument("--points", type=positive_int, default=1_000_000, help="design points to evaluate (default 1e6)")
    p.add_argument("--chunk", type=positive_int, default=250_000, help="points per evaluate() call")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hw", help="comma-separated devices (default: all datasheet devices)")
    return p


def main(argv=None) -> int:
    from tqdm import tqdm
    from sim.sweep import evaluate
    a = build_parser().parse_args(argv)
    devices = [d.strip() for d in a.hw.split(",") if d.strip()] if a.hw else None
    points = random_points(a.points, a.seed, devices)
    evaluate(points.head(64))                      # warm-up: device files, model specs, imports
    t0 = time.perf_counter()
    done = 0
    with tqdm(total=len(points), unit="pt", unit_scale=True, file=sys.stderr, disable=None) as bar:
        for start in range(0, len(points), a.chunk):
            chunk = points.iloc[start:start + a.chunk]
            out = evaluate(chunk)
            done += len(out)
            bar.update(len(out))
    elapsed = time.perf_counter() - t0
    rate = done / elapsed
    print(f"{done:,} points in {elapsed:.2f} s on {platform.machine()} ({os.cpu_count()} cpus, one process): "
          f"{rate * 60:,.0f} points/minute")
    print(f"points_per_s={rate:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
