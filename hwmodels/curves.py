"""Size-dependent achievable fractions ("efficiency curves").

A kernel that moves few bytes or does few FLOPs does not reach the device's peak: it
cannot keep enough memory requests in flight or fill every compute unit. The simulator
charges `size / (peak * efficiency(size))` (plus a separate per-kernel launch overhead),
so a curve maps a size (bytes, or FLOPs) to a fraction in (0, 1].

Two forms, both vectorised numpy (the simulator evaluates millions of points):

- `SaturatingCurve`: `max_fraction * s / (s + half_size)`. Time becomes
  `(s + half_size) / (peak * max_fraction)`: a fixed ramp-up cost plus streaming at the
  achievable rate, the usual shape of bandwidth and GEMM throughput curves. Used for
  datasheet devices, where the two parameters come from public measurements.
- `TableCurve`: points (size, fraction) interpolated in log-log space (log fraction
  linear in log size, i.e. a power law between neighbouring points) and held constant
  beyond the ends. Used for measured (calibrated) devices; with `monotone=False` also for
  factors keyed by something other than kernel size (attention head width).

Both are non-decreasing in size, and both guarantee that a larger kernel is never
predicted to finish sooner than a smaller one (size / fraction is non-decreasing). For a
table that holds on every segment exactly when it holds at the points, which
`check_table` verifies; this is why the interpolation is log-log: linear interpolation of
the fraction would break it between points wherever measured time is flat in size.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# Sizes at or below zero have no logarithm; they are evaluated as this many units so the
# result stays in (0, 1] (the time charged for zero bytes is zero either way).
_SMALLEST_SIZE = 1.0


@dataclass(frozen=True)
class SaturatingCurve:
    max_fraction: float
    half_size: float

    def __post_init__(self):
        if not 0.0 < self.max_fraction <= 1.0:
            raise ValueError(f"max fraction must be in (0, 1], got {self.max_fraction}")
        if not (self.half_size > 0.0 and math.isfinite(self.half_size)):
            raise ValueError(f"half size must be positive, got {self.half_size}")

    def __call__(self, size):
        s = np.maximum(np.asarray(size, dtype=np.float64), _SMALLEST_SIZE)
        fraction = self.max_fraction * s
        if fraction.ndim == 0:
            return fraction / (s + self.half_size)
        # in place: the same operations on the same numbers, without two temporaries (a sweep's hot path)
        return np.divide(fraction, np.add(s, self.half_size, out=s), out=fraction)

    def of_scratch(self, size: np.ndarray) -> np.ndarray:
        """self(size) for a float64 array already at or above _SMALLEST_SIZE that the call may overwrite (the
        caller's temporary): the same operations on the same numbers, one pass and one array fewer."""
        fraction = self.max_fraction * size
        return np.divide(fraction, np.add(size, self.half_size, out=size), out=fraction)

    def to_dict(self) -> dict:
        return {"form": "saturating", "max_fraction": self.max_fraction, "half_size": self.half_size}


def check_table(sizes, fractions, monotone: bool = True) -> None:
    """Raise ValueError (message without location) unless the points form a valid curve.

    Besides order and range, checks that no segment rises so steeply that a larger kernel
    would be predicted faster than a smaller one. On a segment the fraction is
    f1 * (s/s1)**a with a = ln(f2/f1) / ln(s2/s1), so time ~ s/f ~ s**(1-a) is
    non-decreasing exactly when a <= 1, i.e. f2/f1 <= s2/s1.

    `monotone=False` skips both shape checks: for tables whose size is not the amount of
    work (the attention tables are keyed by head width, where no larger-is-slower law holds).
    """
    s = np.asarray(sizes, dtype=np.float64)
    f = np.asarray(fractions, dtype=np.float64)
    if s.ndim != 1 or s.shape != f.shape or len(s) < 1:
        raise ValueError("needs at least one [size, fraction] point")
    if not np.all(np.isfinite(s)) or np.any(s <= 0):
        raise ValueError("sizes must be positive numbers")
    if np.any(np.diff(s) <= 0):
        raise ValueError("sizes must be strictly increasing")
    if not np.all(np.isfinite(f)) or np.any(f <= 0) or np.any(f > 1):
        raise ValueError("fractions must be in (0, 1]")
    if not monotone:
        return
    if np.any(np.diff(f) < 0):
        i = int(np.argmax(np.diff(f) < 0))
        raise ValueError(f"fractions must not decrease with size (point {i + 1} -> {i + 2})")
    limit = f[:-1] * (s[1:] / s[:-1])
    steep = f[1:] > limit * (1 + 1e-9)
    if np.any(steep):
        i = int(np.argmax(steep))
        raise ValueError(f"fraction rises too steeply from point {i + 1} to {i + 2} "
                         f"({f[i]:.3g} -> {f[i + 1]:.3g}): a larger kernel would be "
                         f"predicted faster than a smaller one")


@dataclass(frozen=True)
class TableCurve:
    sizes: tuple[float, ...]
    fractions: tuple[float, ...]
    monotone: bool = True     # False: any shape (see check_table)

    def __post_init__(self):
        check_table(self.sizes, self.fractions, self.monotone)
        # Precomputed arrays for np.interp; object.__setattr__ because the dataclass is frozen.
        object.__setattr__(self, "_log_sizes", np.log(np.asarray(self.sizes, dtype=np.float64)))
        object.__setattr__(self, "_log_fractions", np.log(np.asarray(self.fractions, dtype=np.float64)))

    def __call__(self, size):
        s = np.maximum(np.asarray(size, dtype=np.float64), _SMALLEST_SIZE)
        return np.exp(np.interp(np.log(s), self._log_sizes, self._log_fractions))

    def of_scratch(self, size: np.ndarray) -> np.ndarray:
        """self(size) (SaturatingCurve.of_scratch's counterpart)."""
        return self(size)

    def to_dict(self) -> dict:
        return {"form": "table", "points": [[s, f] for s, f in zip(self.sizes, self.fractions)]}
