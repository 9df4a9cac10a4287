"""Confidence intervals for quality figures (torch-free, numpy only).

Every quality number of the report is a mean over samples; its 95% interval is a percentile bootstrap
over *clusters* of samples (`cluster_of`): samples that share their source text (the 40 cut points of one
TinyStories story) are resampled together, so overlapping prompts are not counted as independent. A paired
difference (Keyformer - H2O on the same samples) is bootstrapped the same way over the per-sample
differences. The resampling is seeded: the same inputs give the same interval.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

N_BOOT = 2000
LEVEL = 0.95
SEED = 0


def cluster_of(sample_id: str) -> str:
    """The independent unit a sample belongs to: `tinystories-<story>` for the cut points of one story,
    the sample itself otherwise."""
    match = re.fullmatch(r"(tinystories-\d+)-\d+", str(sample_id))
    return match.group(1) if match else str(sample_id)


@dataclass(frozen=True)
class Interval:
    mean: float
    lo: float
    hi: float
    n: int  # samples
    clusters: int  # independent units resampled

    def fmt(self, digits: int = 3) -> str:
        if not np.isfinite(self.mean):
            return ""
        return f"{self.mean:.{digits}g} [{self.lo:.{digits}g}, {self.hi:.{digits}g}]"


def bootstrap(values, clusters, transform=None, n_boot: int = N_BOOT, seed: int = SEED) -> Interval:
    """Mean of `values` (one per sample; NaNs dropped) with its percentile-bootstrap interval over the
    clusters. `transform` (e.g. np.exp for a perplexity from mean NLLs) applies to each resampled mean."""
    values = np.asarray(values, dtype=float)
    clusters = np.asarray(clusters)
    keep = np.isfinite(values)
    values, clusters = values[keep], clusters[keep]
    f = transform or (lambda x: x)
    if values.size == 0:
        return Interval(np.nan, np.nan, np.nan, 0, 0)
    labels, index = np.unique(clusters, return_inverse=True)
    sums = np.bincount(index, weights=values, minlength=len(labels))
    counts = np.bincount(index, minlength=len(labels)).astype(float)
    mean = float(f(values.mean()))
    if len(labels) < 2:
        return Interval(mean, np.nan, np.nan, int(values.size), len(labels))
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(labels), size=(n_boot, len(labels)))
    resampled = f(sums[draws].sum(axis=1) / counts[draws].sum(axis=1))
    tail = (1.0 - LEVEL) / 2.0
    lo, hi = np.quantile(resampled, [tail, 1.0 - tail])
    return Interval(mean, float(lo), float(hi), int(values.size), len(labels))
