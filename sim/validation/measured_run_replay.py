"""A measured run (sim.validation.measured_run) replayed in the DES: the same requests (the file's
per-request lengths, else its mean lengths), the same arrival pattern (all at once, or the client's rate
as a gamma process of its burstiness, seed 0, since no tool keeps the send times) and the same
concurrency limit, on the device and model given; each measured metric beside the simulated one.

Client-side clocks: a benchmark client that limits requests in flight (`--max-concurrency`) starts a
request's clock when it sends it, i.e. when a slot frees; the DES holds such a request in its queue
instead (max_batch = the limit), so with a limit TTFT and E2E are measured from the request's admission
(first_scheduled_s), without one from its arrival. ITL is pooled over every gap between two tokens of a
request, as the tools pool it; throughputs are over the makespan, like the tools' duration.

`fit_items(run, ...)` gives the engine-profile fit (sim.fit_profiles) one item per measured metric:
predict(profile) -> the simulated value under that profile (one DES run per profile, shared by the
run's metrics), the measured value and the metric's name.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from sim.des.arrivals import arrival_times
from sim.des.serving import ServeConfig, run_config
from sim.des.trace_file import RequestTrace
from sim.validation.measured_run import MeasuredRun

# the engine profile each tool's engine is simulated with by default (SGLang has none of its own)
DEFAULT_PROFILES = {"vllm": "vllm", "sglang": "vllm", "trtllm": "trtllm"}
STEP_GRID = 64       # decode steps on sim.des.step_grid (relative error < 1e-4): long runs stay quick


def resolve_model(run: MeasuredRun, model=None):
    """--model, else the model the file names (a Hugging Face id through sim.model_names)."""
    from sim.models import load_model
    name = model if model is not None else run.model
    if name is None:
        raise ValueError(f"{run.source}: the {run.tool} result does not name the model: give --model")
    try:
        return load_model(name)
    except (ValueError, FileNotFoundError) as exc:
        if model is not None:
            raise
        raise ValueError(f"{run.source}: model {name!r} ({str(exc).splitlines()[0]}): give --model") from None


def default_profile(run: MeasuredRun) -> str:
    if run.tool == "trtllm" and "pytorch" in run.engine.lower():
        return "trtllm-pytorch"
    return DEFAULT_PROFILES[run.tool]


def replay_requests(run: MeasuredRun, seed: int = 0) -> RequestTrace:
    """The run's requests with their lengths and arrival times."""
    if run.per_request:
        prompts, outputs = run.prompt_lens, run.output_lens
    else:
        prompts = np.full(run.requests, max(int(round(run.mean_prompt)), 1), dtype=np.int64)
        outputs = np.full(run.requests, max(int(round(run.mean_output)), 1), dtype=np.int64)
    n = len(prompts)
    if math.isinf(run.request_rate):
        arrival = np.zeros(n)
    else:
        arrival = arrival_times(run.request_rate, n, cv=1.0 / math.sqrt(run.burstiness), seed=seed)
    return RequestTrace(arrival, prompts, outputs, run.source, None)


def replay_config(run: MeasuredRun, *, hw, model=None, profile=None, tp: int | None = None, seed: int = 0,
                  policy: str = "full", cache_ratio: float = 1.0) -> ServeConfig:
    spec = resolve_model(run, model)
    return ServeConfig(hw=hw, model=spec, policy=policy, cache_ratio=cache_ratio, request_trace=replay_requests(run, seed),
                       qps=None, requests=None, max_batch=run.max_concurrency, tp=tp or run.tp, pp=run.pp,
                       profile=profile or default_profile(run), overlong="clip", step_grid=STEP_GRID)


def simulated_metrics(res, limited: bool) -> dict:
    """The tools' metrics from a ServeResult (client clocks: from admission when the client limited
    concurrency, from arrival otherwise)."""
    req = res.requests[res.requests.completed]
    start = req["first_scheduled_s"] if limited else req["arrival_s"]
    ttft = (req["first_token_s"] - start).to_numpy(float)
    e2e = (req["finish_s"] - start).to_numpy(float)
    out = req["output_tokens"].to_numpy(float)
    many = out > 1
    tpot = ((req["finish_s"] - req["first_token_s"]).to_numpy(float)[many] / (out[many] - 1))
    values = {"requests_per_s": res.requests_per_s, "tokens_per_s": res.tokens_per_s}
    for name, series in (("ttft_s", ttft), ("tpot_s", tpot), ("e2e_s", e2e)):
        if len(series):
            values[f"{name}_mean"] = float(series.mean())
            for stat, q in (("p50", 50), ("p90", 90), ("p99", 99)):
                values[f"{name}_{stat}"] = float(np.percentile(series, q))
    for stat in ("mean", "p50", "p90", "p99"):
        if res.itl_s.get(stat) is not None:
            values[f"itl_s_{stat}"] = float(res.itl_s[stat])
    return values


@dataclass
class Comparison:
    run: MeasuredRun
    config: ServeConfig
    rows: list            # dicts: metric, measured, simulated, error_pct
    dropped: int
    overlong: int
    wall_s: float

    def to_dict(self) -> dict:
        return {"source": self.run.source, "tool": self.run.tool, "engine": self.run.engine,
                "model": self.run.model, "simulated_model": getattr(self.config.model, "name", self.config.model),
                "hw": str(getattr(self.config.hw, "name", self.config.hw)), "profile": str(self.config.profile),
                "requests": self.run.requests,
                "request_rate": "inf" if math.isinf(self.run.request_rate) else self.run.request_rate,
                "max_concurrency": self.run.max_concurrency, "tp": self.config.tp,
                "per_request_lengths": self.run.per_request, "notes": self.run.notes,
                "dropped": self.dropped, "overlong_clipped": self.overlong, "simulated_s": self.wall_s,
                "metrics": self.rows}


def compare(run: MeasuredRun, *, hw, model=None, profile=None, tp=None, seed: int = 0) -> Comparison:
    cfg = replay_config(run, hw=hw, model=model, profile=profile, tp=tp, seed=seed)
    res = run_config(cfg)
    simulated = simulated_metrics(res, run.max_concurrency is not None)
    rows = []
    for metric, measured in run.metrics.items():
        sim = simulated.get(metric)
        error = 100.0 * (sim - measured) / measured if sim is not None and measured else float("nan")
        rows.append({"metric": metric, "measured": measured, "simulated": sim, "error_pct": error})
    return Comparison(run, cfg, rows, res.dropped, res.config["replay"]["overlong_requests"], res.wall_s)


@dataclass(frozen=True)
class FitItem:
    """One measured value the engine-profile fit can match: predict(profile) -> simulated value."""
    predict: Callable
    measured: float
    metric: str
    source: str


def fit_items(run: MeasuredRun, *, hw, model=None, tp=None, metrics=None, seed: int = 0) -> list[FitItem]:
    """One FitItem per measured metric of `run` (or those named in `metrics`). A profile's DES run is
    shared by the run's items (cached by the profile object); each costs one replay of the run."""
    base = replay_config(run, hw=hw, model=model, tp=tp, seed=seed)
    limited = run.max_concurrency is not None
    cache: dict = {}

    def simulate(profile) -> dict:
        key = id(profile) if not isinstance(profile, str) else profile
        if key not in cache or cache[key][0] is not profile:
            if len(cache) > 16:
                cache.clear()
            from dataclasses import replace
            cache[key] = (profile, simulated_metrics(run_config(replace(base, profile=profile)), limited))
        return cache[key][1]

    wanted = run.metrics if metrics is None else {k: v for k, v in run.metrics.items() if k in metrics}

    def predictor(metric):
        return lambda profile: simulate(profile).get(metric, float("nan"))

    return [FitItem(predictor(metric), value, metric, run.source) for metric, value in wanted.items()]


def markdown(comparisons: list[Comparison], command: str) -> str:
    """The report: per run, what was replayed and each metric's error."""
    lines = ["# kvsim validation: measured benchmark runs", "",
             f"Generated by `{command}`. Each run is replayed in the DES (sim.validation.measured_run_replay): the "
             "same requests and lengths, the same arrival pattern and concurrency limit; error = (simulated - "
             "measured) / measured.", ""]
    for c in comparisons:
        d = c.to_dict()
        lines += [f"## {c.run.source}", "",
                  f"{c.run.describe()}; simulated as {d['simulated_model']} on {d['hw']} (tp {d['tp']}), profile "
                  f"{d['profile']}; {'per-request lengths' if c.run.per_request else 'mean lengths'}; "
                  f"{c.dropped} dropped, {c.overlong} clipped to the context.", ""]
        lines += [f"- {note}" for note in c.run.notes] + ([""] if c.run.notes else [])
        lines += ["| metric | measured | simulated | error % |", "|---|---|---|---|"]
        for row in c.rows:
            sim = "n/a" if row["simulated"] is None else f"{row['simulated']:.4g}"
            err = "n/a" if not np.isfinite(row["error_pct"]) else f"{row['error_pct']:+.1f}"
            lines.append(f"| {row['metric']} | {row['measured']:.4g} | {sim} | {err} |")
        lines.append("")
    return "\n".join(lines)


def text_lines(comparisons: list[Comparison]) -> list[str]:
    out = []
    for c in comparisons:
        errors = [abs(r["error_pct"]) for r in c.rows if np.isfinite(r["error_pct"])]
        mape = f"MAPE {np.mean(errors):.1f}% over {len(errors)} metrics" if errors else "no comparable metric"
        out.append(f"{c.run.source}: {c.run.describe()}: {mape}")
        out += [f"  {r['metric']:14s} measured {r['measured']:.4g}  simulated "
                + ("n/a" if r["simulated"] is None else f"{r['simulated']:.4g}")
                + ("" if not np.isfinite(r["error_pct"]) else f"  ({r['error_pct']:+.1f}%)") for r in c.rows]
    return out
