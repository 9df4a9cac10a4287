"""Request-length distributions for synthetic workloads: prompt and output lengths drawn per request.

A distribution is named by a short spec and its *mean* is the `prompt` (or `gen`) length it is applied
to, so a sweep's `prompts`/`gens` axes keep their meaning (the mean request) and `fixed` is today's
workload exactly:

- `fixed`: every request has the mean length (the default; draws nothing, so the output is unchanged);
- `uniform:W` (0 <= W <= 1): whole numbers uniform on [round(m (1 - W)), round(m (1 + W))], mean m
  (`uniform:1` spans 0..2m, clipped to >= 1);
- `lognormal:S` (0 < S <= 3): a lognormal with mean m and log-space standard deviation S
  (mu = ln m - S^2 / 2; median m exp(-S^2 / 2)); S = 1 gives ShareGPT-like heavy tails. Past S = 3 the
  median is under 1% of the mean (S = 30: every request 1 token for a stated mean of 1024), so a run's
  lengths no longer have the mean it is labelled with: refused;
- `empirical:TRACE` (a request trace: azure-code-2023, azure-conv-2023 or a CSV/JSONL file, see
  sim.des.trace_file): the trace's own prompt (or output) lengths, drawn with replacement, scaled so
  their mean is m (m = the trace's mean rounded, which a run that gives no prompt / gen takes: the
  lengths as recorded).

Draws are rounded to whole tokens and clipped to >= 1 token; they are not clipped to the model's context
(sim.serve warns past it, as for fixed lengths). Each distribution draws from its own stream of the
workload's seed (prompt: [seed, 1], output: [seed, 2]), so the arrival times do not move when a length
distribution is added.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from sim.des.trace_file import load_trace, resolve

LENGTH_DISTS = ("fixed", "uniform", "lognormal", "empirical")
# median = mean * exp(-S^2 / 2) >= 1% of the mean  <=>  S <= sqrt(2 ln 100) ~ 3.03
LOGNORMAL_MAX_SIGMA = 3.0
SPEC_HELP = ("fixed | uniform:W (0..1, lengths m(1-W)..m(1+W)) | lognormal:S (log-space sigma) | empirical:TRACE "
             "(a trace's lengths); the mean is the length")


@lru_cache(maxsize=8)
def _trace_lengths(path: str, mtime: float, spec: str) -> dict[str, np.ndarray]:
    trace = load_trace(spec)
    return {"prompt": trace.prompt_tokens, "output": trace.output_tokens}


def empirical_lengths(spec: str, role: str) -> np.ndarray:
    """The prompt or output lengths of the request trace `spec` (read once per file version)."""
    path = resolve(spec)[0]
    return _trace_lengths(str(Path(path).resolve()), path.stat().st_mtime, spec)[role]


@dataclass(frozen=True)
class LengthDist:
    kind: str = "fixed"
    param: float | None = None
    source: str | None = None      # empirical: the request trace the lengths come from

    @classmethod
    def parse(cls, spec: str) -> "LengthDist":
        """'fixed', 'uniform:0.5', 'lognormal:1' -> LengthDist; ValueError with the problem otherwise."""
        if isinstance(spec, LengthDist):
            return spec
        if not isinstance(spec, str):
            raise ValueError("not a name[:parameter] text")
        kind, _, arg = spec.strip().partition(":")
        if kind not in LENGTH_DISTS:
            raise ValueError(f"unknown distribution {kind!r}")
        if kind == "fixed":
            if arg:
                raise ValueError("fixed takes no parameter")
            return cls("fixed")
        if kind == "empirical":
            if not arg.strip():
                raise ValueError("empirical needs a request trace (empirical:azure-conv-2023 or empirical:FILE)")
            empirical_lengths(arg.strip(), "prompt")      # a missing or malformed trace fails here
            return cls("empirical", None, arg.strip())
        try:
            value = float(arg)
        except ValueError:
            raise ValueError(f"{kind} needs a number ({kind}:{'W' if kind == 'uniform' else 'S'})") from None
        if kind == "uniform" and not 0 <= value <= 1:
            raise ValueError("uniform:W needs 0 <= W <= 1")
        if kind == "lognormal" and not (0 < value <= LOGNORMAL_MAX_SIGMA):
            raise ValueError(f"lognormal:S needs 0 < S <= {LOGNORMAL_MAX_SIGMA:g} (beyond it the median is under 1% "
                             "of the mean: the drawn lengths would not have the stated mean)")
        return cls(kind, value)

    @property
    def is_fixed(self) -> bool:
        return self.kind == "fixed"

    def __str__(self) -> str:
        if self.kind == "empirical":
            return f"empirical:{self.source}"
        return self.kind if self.is_fixed else f"{self.kind}:{self.param:g}"

    def mean_length(self, role: str) -> int:
        """empirical: the trace's mean prompt or output length, in whole tokens."""
        return max(int(round(float(empirical_lengths(self.source, role).mean()))), 1)

    def sample(self, mean: int, n: int, rng: np.random.Generator | None, role: str = "prompt") -> np.ndarray:
        """n whole lengths >= 1 whose expected value is (close to) `mean` (role: which lengths of an
        empirical trace, prompt or output)."""
        if self.is_fixed:
            return np.full(n, mean, dtype=np.int64)
        if self.kind == "empirical":
            values = empirical_lengths(self.source, role)
            if mean == self.mean_length(role):      # the trace's own mean (rounded): its lengths as recorded
                return rng.choice(values, size=n).astype(np.int64)
            draws = rng.choice(values, size=n) * (mean / float(values.mean()))
            return np.maximum(np.rint(draws), 1).astype(np.int64)
        if self.kind == "uniform":
            lo, hi = round(mean * (1 - self.param)), round(mean * (1 + self.param))
            draws = rng.integers(lo, hi + 1, size=n)
        else:
            sigma = self.param
            draws = np.rint(rng.lognormal(math.log(mean) - sigma * sigma / 2, sigma, size=n))
        return np.maximum(draws, 1).astype(np.int64)


def check_spec(spec) -> str | None:
    """param() check: the problem phrase of a bad spec, or None."""
    try:
        LengthDist.parse(spec)
    except ValueError as exc:
        return f"must be fixed, uniform:W (0 <= W <= 1), lognormal:S (0 < S <= 3) or empirical:TRACE ({exc})"
    return None


def draw_lengths(prompt: int, gen: int, n: int, seed: int, prompt_dist="fixed", gen_dist="fixed"):
    """(prompt_tokens, output_tokens) arrays of n requests; fixed draws nothing."""
    p, g = LengthDist.parse(prompt_dist), LengthDist.parse(gen_dist)
    return (p.sample(prompt, n, None if p.is_fixed else np.random.default_rng([seed, 1]), "prompt"),
            g.sample(gen, n, None if g.is_fixed else np.random.default_rng([seed, 2]), "output"))
