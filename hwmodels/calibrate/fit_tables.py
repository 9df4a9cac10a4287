"""The table helpers of the fit (pure numpy): efficiency fractions out of medians, made a valid table.

fit.py (GEMV/GEMM curves) and fit_attention.py (attention tables) both use them; a module of their own so
the two import it and not each other.
"""
from __future__ import annotations

import math

import numpy as np

from ..curves import TableCurve, check_table

# Fractions are written with this many decimals; the smallest representable one.
DECIMALS = 5
SMALLEST_FRACTION = 10.0 ** -DECIMALS


def isotonic_increasing(values) -> np.ndarray:
    """Least-squares non-decreasing fit (pool-adjacent-violators, equal weights)."""
    blocks: list[list[float]] = []   # [mean, count]
    for v in np.asarray(values, dtype=np.float64):
        blocks.append([v, 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            mean2, n2 = blocks.pop()
            mean1, n1 = blocks.pop()
            blocks.append([(mean1 * n1 + mean2 * n2) / (n1 + n2), n1 + n2])
    return np.concatenate([np.full(int(n), mean) for mean, n in blocks])


def raw_efficiency(sizes, seconds, peak_rate: float, overhead_s: float) -> np.ndarray:
    """Fraction of `peak_rate` achieved once the per-op overhead (charged separately by the
    simulator) is taken out; at most 1 by construction."""
    sizes = np.asarray(sizes, dtype=np.float64)
    busy = np.maximum(np.asarray(seconds, dtype=np.float64) - overhead_s, sizes / peak_rate)
    return sizes / (peak_rate * busy)


def round_fraction(value: float) -> float:
    """Down to the written number of decimals (never above the measurement), at most 1, at least the
    smallest representable fraction."""
    scale = 10.0 ** DECIMALS
    return max(math.floor(min(value, 1.0) * scale) / scale, SMALLEST_FRACTION)


def table_document(curve: TableCurve, size_unit: str, source: str) -> dict:
    """A fitted table as the hardware file writes it (sizes are whole numbers of their unit)."""
    return {"form": "table", "size_unit": size_unit,
            "points": [[int(size), fraction] for size, fraction in zip(curve.sizes, curve.fractions)],
            "source": source}


def consistent_table(sizes, fractions) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """Make measured fractions a valid TableCurve: non-decreasing (isotonic fit), in (0, 1],
    never rising faster than size (a larger kernel is never predicted faster), rounded down
    to DECIMALS decimals. Returns integer sizes and the fractions."""
    sizes = np.asarray(sizes, dtype=np.float64)
    order = np.argsort(sizes)
    sizes = sizes[order]
    fitted = np.clip(isotonic_increasing(np.asarray(fractions, dtype=np.float64)[order]), 0.0, 1.0)
    out_sizes: list[int] = []
    out_fractions: list[float] = []
    for size, value in zip(sizes, fitted):
        size = int(round(size))
        if out_sizes and size <= out_sizes[-1]:
            continue  # duplicate size after rounding: keep the first
        if out_fractions:
            value = min(value, out_fractions[-1] * size / out_sizes[-1])
            value = max(value, out_fractions[-1])
        value = round_fraction(value)
        if out_fractions:
            value = max(value, out_fractions[-1])
        out_sizes.append(size)
        out_fractions.append(value)
    check_table(out_sizes, out_fractions)
    return tuple(out_sizes), tuple(out_fractions)
