"""Request workloads for the serving simulator: arrival times, prompt and output lengths.

Three sources, all returning a `Workload` (arrays sorted by arrival time, first arrival at t >= 0):
- Poisson arrivals at `qps` (exponential gaps), like vLLM `benchmark_serving --request-rate Q`;
- gamma arrivals at `qps` with a coefficient of variation `cv` (vLLM's `--burstiness` is the gamma
  shape, i.e. burstiness = 1 / cv**2; cv = 1 is Poisson, cv > 1 burstier, cv < 1 more regular);
- replay of a CSV or JSONL file with one request per row: arrival time (s), prompt tokens, output tokens.

As in vLLM's benchmark the first request is sent at t = 0 and each later one after a random gap;
`qps = inf` sends every request at t = 0 (a closed burst, the saturation test).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from kvcommon import FieldError
from sim.des.lengths import LengthDist, draw_lengths
from sim.des.trace_file import resolve as resolve_trace

ARRIVAL_KINDS = ("poisson", "gamma")

# Column names accepted in replay files (first match wins), so exports of common tools load as is.
ARRIVAL_COLUMNS = ("arrival_s", "arrival_time", "timestamp", "time_s", "arrival")
PROMPT_COLUMNS = ("prompt_tokens", "prompt_len", "input_len", "input_tokens", "prompt")
OUTPUT_COLUMNS = ("output_tokens", "output_len", "gen_len", "gen", "output")


@dataclass(frozen=True)
class Workload:
    """One simulated benchmark run: request i arrives at `arrival_s[i]` with the given lengths."""

    arrival_s: np.ndarray      # float64, non-decreasing
    prompt_tokens: np.ndarray  # int64 >= 1
    output_tokens: np.ndarray  # int64 >= 1 (tokens to generate, the first one comes from prefill)
    source: str                # "poisson", "gamma(cv=2)", or the replay file path
    # a replayed trace's provenance (sim.des.workload): its name, window, time scale, overlong requests
    notes: dict = field(default_factory=dict)

    def __post_init__(self):
        n = len(self.arrival_s)
        if not (len(self.prompt_tokens) == len(self.output_tokens) == n):
            raise ValueError("workload arrays must have the same length")
        if n == 0:
            raise ValueError("workload has no requests")
        if np.any(np.diff(self.arrival_s) < 0):
            raise ValueError("workload arrival times must be sorted")
        if np.any(self.prompt_tokens < 1) or np.any(self.output_tokens < 1):
            raise ValueError("prompt and output lengths must be >= 1 token")

    def __len__(self) -> int:
        return len(self.arrival_s)


def _gaps(kind: str, qps: float, n: int, cv: float, rng: np.random.Generator) -> np.ndarray:
    if math.isinf(qps):
        return np.zeros(n)
    if kind == "poisson":
        return rng.exponential(1.0 / qps, size=n)
    # gamma with mean 1/qps and coefficient of variation cv: shape = 1/cv^2, scale = mean/shape
    shape = 1.0 / (cv * cv)
    return rng.gamma(shape, 1.0 / (qps * shape), size=n)


def arrival_times(qps: float, n: int, *, cv: float = 1.0, seed: int = 0) -> np.ndarray:
    """n arrival times of a gamma process at `qps` (cv 1: Poisson; inf: all at t = 0), the first at 0, as
    vLLM's benchmark sends them (its --burstiness B is cv = 1 / sqrt(B))."""
    gaps = _gaps("poisson" if cv == 1.0 else "gamma", qps, n, cv, np.random.default_rng(seed))
    gaps[0] = 0.0
    return np.cumsum(gaps)


def synthetic_workload(kind: str, qps: float, requests: int, prompt: int, gen: int, *,
                       cv: float = 1.0, seed: int = 0, prompt_dist="fixed", gen_dist="fixed") -> Workload:
    """`requests` requests arriving as a Poisson or gamma process at `qps`, their lengths `prompt` and
    `gen` (fixed) or drawn from distributions of that mean (sim.des.lengths)."""
    if kind not in ARRIVAL_KINDS:
        raise ValueError(f"unknown arrival process {kind!r}; expected one of {', '.join(ARRIVAL_KINDS)} or a file")
    # errors name the fields (sim.des.cli words them as flags)
    if not (qps > 0):
        raise FieldError("qps", "must be > 0 (or inf)", qps)
    if requests < 1:
        raise FieldError("requests", "must be >= 1", requests)
    for name, value in (("prompt", prompt), ("gen", gen)):
        if value < 1:
            raise FieldError(name, "must be >= 1", value)
    if not (cv > 0 and math.isfinite(cv)):
        raise FieldError("cv", "must be a positive number", cv)
    rng = np.random.default_rng(seed)
    gaps = _gaps(kind, qps, requests, cv, rng)
    gaps[0] = 0.0  # vLLM sends the first request immediately, then sleeps a gap before each next one
    arrival = np.cumsum(gaps)
    source = "poisson" if kind == "poisson" else f"gamma(cv={cv:g})"
    pdist, gdist = LengthDist.parse(prompt_dist), LengthDist.parse(gen_dist)
    source += "".join(f", {what} lengths {d}" for what, d in (("prompt", pdist), ("output", gdist)) if not d.is_fixed)
    prompts, outputs = draw_lengths(prompt, gen, requests, seed, pdist, gdist)
    notes = {}
    for what, d in (("prompt", pdist), ("output", gdist)):
        if d.kind == "empirical":
            notes[f"{what}_lengths_from"] = d.source
            attribution = resolve_trace(d.source)[2]
            if attribution:
                notes["attribution"] = attribution
    return Workload(arrival, prompts, outputs, source, notes)


def _pick_column(frame: pd.DataFrame, names: tuple[str, ...], what: str, path: Path) -> str:
    for name in names:
        if name in frame.columns:
            return name
    raise ValueError(f"{path}: no {what} column (expected one of {', '.join(names)}); "
                     f"found {', '.join(map(str, frame.columns)) or 'none'}")


def _read_table(path: Path) -> pd.DataFrame:
    if path.suffix.lower() in (".jsonl", ".ndjson", ".json"):
        rows = []
        with path.open() as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
        return pd.DataFrame(rows)
    try:
        return pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not a readable CSV ({str(exc).splitlines()[0]})") from None


def load_workload(path: str | Path, requests: int | None = None) -> Workload:
    """Replay file -> Workload. CSV (header row) or JSONL (one object per line).

    Columns: arrival time in seconds (`arrival_s`), prompt tokens (`prompt_tokens`), output tokens
    (`output_tokens`); common aliases are accepted (see the *_COLUMNS tuples). Rows are sorted by arrival;
    `requests` keeps the first N after sorting.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"arrivals file {path} not found (use poisson, gamma or a CSV/JSONL file)")
    frame = _read_table(path)
    if frame.empty:
        raise ValueError(f"{path}: no requests in the file")
    cols = [_pick_column(frame, names, what, path) for names, what in
            ((ARRIVAL_COLUMNS, "arrival time"), (PROMPT_COLUMNS, "prompt length"),
             (OUTPUT_COLUMNS, "output length"))]
    try:
        arrival, prompt, output = (pd.to_numeric(frame[c], errors="raise").to_numpy(float) for c in cols)
    except (ValueError, TypeError):
        raise ValueError(f"{path}: non-numeric value in columns {', '.join(cols)}") from None
    if not np.all(np.isfinite(arrival)) or np.any(arrival < 0):
        raise ValueError(f"{path}: arrival times must be finite and >= 0 seconds")
    for values, col in ((prompt, cols[1]), (output, cols[2])):
        if np.any(values < 1) or np.any(values != np.round(values)):
            raise ValueError(f"{path}: {col} must be whole numbers >= 1")
    order = np.argsort(arrival, kind="stable")
    if requests is not None:
        if requests < 1:
            raise FieldError("requests", "must be >= 1", requests)
        order = order[:requests]
    return Workload(arrival[order], prompt[order].astype(np.int64), output[order].astype(np.int64), str(path))


def make_workload(arrivals: str, qps: float, requests: int | None, prompt: int | None, gen: int | None, *,
                  cv: float = 1.0, seed: int = 0, prompt_dist="fixed", gen_dist="fixed") -> Workload:
    """`arrivals` is 'poisson', 'gamma' or a replay file path (which then gives the lengths)."""
    if arrivals in ARRIVAL_KINDS:
        if requests is None or prompt is None or gen is None:
            raise ValueError(f"arrivals {arrivals} needs requests, prompt and gen")
        return synthetic_workload(arrivals, qps, requests, prompt, gen, cv=cv, seed=seed,
                                  prompt_dist=prompt_dist, gen_dist=gen_dist)
    return load_workload(arrivals, requests)
