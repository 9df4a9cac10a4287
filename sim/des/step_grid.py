"""Decode-step times on a grid, for long replays: a decode step's time depends only on the batch size and
the mean KV length per request (sim.engine.decode_step_time: one batched attention kernel over the
total), so the timer computes it exactly at grid points of the mean (`points_per_octave` per doubling)
and interpolates linearly in log length between the two around each step. A one-hour trace runs
hundreds of thousands of decode steps whose (batch, mean) pairs never repeat exactly but sit on a few
tens of thousands of grid cells.

The interpolation error is bounded by the curvature of the step time in log length over one cell; at
64 points per octave it is below 1e-4 relative on the shipped devices and models
(tests/sim/test_step_grid.py compares against the exact timer). Prefill and mixed steps stay exact.
"""
from __future__ import annotations

import math

import numpy as np


class GridDecodeTimer:
    """Wraps a StepTimer (sim.des.server): decode() interpolated on the grid, prefill / mixed passed on."""

    def __init__(self, timer, points_per_octave: int):
        if points_per_octave < 1:
            raise ValueError(f"step_grid must be >= 1 points per octave, got {points_per_octave}")
        self.timer, self.k = timer, float(points_per_octave)
        self._memo: dict[tuple[int, int], float] = {}

    def _at(self, size: int, cell: int) -> float:
        key = (size, cell)
        hit = self._memo.get(key)
        if hit is None:
            mean = 2.0 ** (cell / self.k)
            hit = self._memo[key] = self.timer.decode(np.full(size, mean))
        return hit

    def decode(self, kv: np.ndarray) -> float:
        size = int(kv.size)
        if size == 0:
            return self.timer.decode(kv)
        mean = float(kv.sum()) / size
        if mean < 1.0:
            return self.timer.decode(kv)
        pos = math.log2(mean) * self.k
        lo = math.floor(pos)
        frac = pos - lo
        low = self._at(size, lo)
        return low if frac == 0.0 else low + (self._at(size, lo + 1) - low) * frac

    def prefill(self, chunks) -> float:
        return self.timer.prefill(chunks)

    def mixed(self, kv: np.ndarray, chunks) -> float:
        return self.timer.mixed(kv, chunks)
