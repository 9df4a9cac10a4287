"""Compact growable storage for what a serving run records per step: numpy columns that double their
capacity (`StepColumns`, the timeline) and a run-length record of a pooled float sample (`RunLengths`,
the inter-token gaps) with its exact mean and percentiles.

Why run lengths: the decode requests of one step mostly last emitted a token at the same moment (the end
of the previous step), so their gaps are a few runs of one value. A million requests of 512 tokens pool
half a billion gaps (4 GB as float64) in a few million runs. `summarize_runs` gives the same numbers as
sim.des.metrics.summarize on the expanded sample, bit for bit: the percentiles are numpy's `linear`
method applied to order statistics read from the sorted runs, and the mean is numpy's pairwise sum
(float64 add.reduce splits a contiguous array in halves, multiples of 8, down to blocks of 128) replayed
over the runs, materialising only nodes of at most LEAF values (tests/sim/test_des_columns.py).
"""
from __future__ import annotations

import numpy as np

LEAF = 1 << 16          # values expanded at once when replaying the pairwise sum
PERCENTILES = (50, 90, 99)


class StepColumns:
    """Named numpy columns appended one row at a time (amortised O(1), no Python objects per row)."""

    def __init__(self, dtypes: dict[str, type], capacity: int = 1024):
        self._cols = {name: np.empty(capacity, dtype=dt) for name, dt in dtypes.items()}
        self._names = tuple(dtypes)
        self.n = 0

    def append(self, *values) -> None:
        if self.n == len(self._cols[self._names[0]]):
            for name, col in self._cols.items():
                grown = np.empty(2 * len(col), dtype=col.dtype)
                grown[:self.n] = col[:self.n]
                self._cols[name] = grown
        for name, value in zip(self._names, values):
            self._cols[name][self.n] = value
        self.n += 1

    def arrays(self) -> dict[str, np.ndarray]:
        """The rows so far, one trimmed array per column."""
        return {name: col[:self.n].copy() for name, col in self._cols.items()}


class RunLengths:
    """A float64 sample in pool order, stored as (value, count) runs of equal consecutive values."""

    def __init__(self, capacity: int = 1024):
        self._values = np.empty(capacity)
        self._counts = np.empty(capacity, dtype=np.int64)
        self.runs = 0
        self.size = 0           # values in the sample

    def _reserve(self, extra: int) -> None:
        need = self.runs + extra
        if need > len(self._values):
            cap = max(need, 2 * len(self._values))
            for name in ("_values", "_counts"):
                old = getattr(self, name)
                grown = np.empty(cap, dtype=old.dtype)
                grown[:self.runs] = old[:self.runs]
                setattr(self, name, grown)

    def append(self, value: float) -> None:
        self.extend(np.array([value], dtype=float))

    def extend(self, values: np.ndarray) -> None:
        n = len(values)
        if not n:
            return
        breaks = np.flatnonzero(values[1:] != values[:-1]) if n > 1 else ()
        first = values[0]
        # a run continuing the previous step's last one stays one run (the order is what matters)
        merge = self.runs and first == self._values[self.runs - 1]
        if not len(breaks):         # the common step: every gap the same
            if merge:
                self._counts[self.runs - 1] += n
            else:
                self._reserve(1)
                self._values[self.runs] = first
                self._counts[self.runs] = n
                self.runs += 1
            self.size += n
            return
        starts = np.empty(len(breaks) + 1, dtype=np.int64)
        starts[0] = 0
        starts[1:] = breaks + 1
        counts = np.diff(starts, append=n)
        if merge:
            self._counts[self.runs - 1] += counts[0]
            starts, counts = starts[1:], counts[1:]
        k = len(starts)
        self._reserve(k)
        self._values[self.runs:self.runs + k] = values[starts]
        self._counts[self.runs:self.runs + k] = counts
        self.runs += k
        self.size += n

    @property
    def values(self) -> np.ndarray:
        return self._values[:self.runs]

    @property
    def counts(self) -> np.ndarray:
        return self._counts[:self.runs]

    def expand(self) -> np.ndarray:
        """The sample itself (tests; memory of every value)."""
        return np.repeat(self.values, self.counts)


def _pairwise_sum(values: np.ndarray, ends: np.ndarray, lo: int, hi: int) -> float:
    """numpy's float64 add.reduce of sample[lo:hi] (run i covers [ends[i-1], ends[i]))."""
    n = hi - lo
    if n <= LEAF:
        first = int(np.searchsorted(ends, lo, side="right"))
        last = int(np.searchsorted(ends, hi - 1, side="right"))
        reps = np.diff(np.clip(np.concatenate(([lo], ends[first:last], [hi])), lo, hi))
        return float(np.add.reduce(np.repeat(values[first:last + 1], reps)))
    half = n // 2
    half -= half % 8
    return _pairwise_sum(values, ends, lo, lo + half) + _pairwise_sum(values, ends, lo + half, hi)


def _lerp(a: float, b: float, t: float) -> float:
    """numpy's _lerp: a + (b - a) t, computed from b's side when t >= 0.5."""
    diff = b - a
    return b - diff * (1 - t) if t >= 0.5 else a + diff * t


def summarize_runs(runs: RunLengths) -> dict[str, float | None]:
    """mean, p50, p90, p99 of the sample, equal to sim.des.metrics.summarize(runs.expand())."""
    if not runs.size:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    values, counts = runs.values, runs.counts
    mean = _pairwise_sum(values, np.cumsum(counts), 0, runs.size) / runs.size
    order = np.argsort(values, kind="stable")
    ordered, ends = values[order], np.cumsum(counts[order])
    n = runs.size
    at = lambda k: float(ordered[np.searchsorted(ends, k, side="right")])   # k-th smallest (0-based)
    out = {"mean": float(mean)}
    for p, q in zip(PERCENTILES, np.true_divide(np.asarray(PERCENTILES), 100)):
        virtual = (n - 1) * q
        if virtual >= n - 1:
            value = at(n - 1)
        else:
            prev = np.floor(virtual)
            value = _lerp(at(int(prev)), at(int(prev) + 1), float(virtual - prev))
        out[f"p{p}"] = float(value)
    return out
