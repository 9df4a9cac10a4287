"""Serving metrics, defined as vLLM's `benchmarks/benchmark_serving.py` defines them (docs/metrics.md).

Per request i (times in seconds of simulated time):
- TTFT  = first_token_i - arrival_i
- E2E   = finish_i - arrival_i                                (vLLM: E2EL, "latency")
- TPOT  = (E2E - TTFT) / (output_tokens_i - 1), only for requests with more than one output token
- queue = first_scheduled_i - arrival_i                       (vLLM server metric "time in queue")
ITL is pooled over all requests: every gap between two consecutive tokens of one request.
Throughput over the makespan = last completion - first arrival (vLLM's benchmark duration):
output tokens/s, requests/s, and total (prompt + output) tokens/s.
Each distribution is reported as mean, p50, p90, p99 (numpy linear-interpolated percentiles, like vLLM).
Only completed requests enter the statistics; dropped requests are counted separately.

Memory: a result keeps compact per-request and per-step numpy columns (about 100 bytes a request) and
builds the `requests` and `timeline` DataFrames only when asked for. The pooled ITL sample is kept as
runs of equal gaps (sim.des.columns), its statistics exact: equal to numpy's on the expanded sample.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import pandas as pd

from .columns import summarize_runs
from .scheduler import DONE, DROPPED

STAT_KEYS = ("mean", "p50", "p90", "p99")
DISTRIBUTIONS = ("ttft_s", "tpot_s", "itl_s", "e2e_s", "queue_s", "kv_bytes")


def summarize(values) -> dict[str, float | None]:
    """mean, p50, p90, p99 of `values` (None for each when there are no values)."""
    values = np.asarray(values, dtype=float)
    values = values[~np.isnan(values)]
    if not len(values):
        return {k: None for k in STAT_KEYS}
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {"mean": float(values.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


def summarize_over_time(values, durations, idle_s: float = 0.0) -> dict[str, float | None]:
    """Time-weighted mean, p50, p90, p99 of a quantity held for `durations` (plus `idle_s` at zero):
    the p-th percentile is the smallest value held for at least p % of the time."""
    values = np.append(np.asarray(values, dtype=float), 0.0)
    weights = np.append(np.asarray(durations, dtype=float), max(idle_s, 0.0))
    total = weights.sum()
    if total <= 0:
        return {k: None for k in STAT_KEYS}
    order = np.argsort(values, kind="stable")
    ordered, cum = values[order], np.cumsum(weights[order]) / total

    def held_at_least(q: float) -> float:
        return float(ordered[min(np.searchsorted(cum, q - 1e-12), len(cum) - 1)])

    return {"mean": float((values * weights).sum() / total),
            "p50": held_at_least(0.5), "p90": held_at_least(0.9), "p99": held_at_least(0.99)}


_TABLES = ("requests", "timeline", "request_columns", "timeline_columns")


def request_columns(sched) -> dict:
    """What the per-request table is computed from: the scheduler's own arrays (no copies) and its drops."""
    return {"arrival": sched.arrival, "prompt": sched.prompt, "output": sched.output,
            "first_scheduled": sched.first_scheduled, "first_token": sched.first_token, "finish": sched.finish,
            "preemptions": sched.preemptions, "status": sched.status, "drop_reason": sched.drop_reason}


def latencies(cols: dict, rows=slice(None)) -> dict[str, np.ndarray]:
    """TTFT, TPOT, E2E and queueing time of the requests `rows` (NaN where not reached)."""
    arrival, first, out_tokens = cols["arrival"][rows], cols["first_token"][rows], cols["output"][rows]
    ttft = first - arrival
    e2e = cols["finish"][rows] - arrival
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out_tokens > 1, (e2e - ttft) / (out_tokens - 1), np.nan)
    return {"ttft_s": ttft, "tpot_s": tpot, "e2e_s": e2e, "queue_s": cols["first_scheduled"][rows] - arrival}


def request_frame(cols: dict, start: int = 0, stop: int | None = None) -> pd.DataFrame:
    """Rows start..stop - 1 of the per-request table (`--per-request`'s CSV)."""
    rows = slice(start, len(cols["arrival"]) if stop is None else stop)
    lat, status = latencies(cols, rows), cols["status"][rows]
    reasons = cols["drop_reason"]
    return pd.DataFrame({
        "arrival_s": cols["arrival"][rows], "prompt_tokens": cols["prompt"][rows],
        "output_tokens": cols["output"][rows], "first_scheduled_s": cols["first_scheduled"][rows],
        "first_token_s": cols["first_token"][rows], "finish_s": cols["finish"][rows], **lat,
        "preemptions": cols["preemptions"][rows], "completed": status == DONE, "dropped": status == DROPPED,
        "drop_reason": [reasons.get(i, "") for i in range(rows.start, rows.stop)],
    })


@dataclass
class ServeResult:
    """Outcome of one serving simulation; `to_dict()` is what `sim.serve --json` prints."""

    config: dict
    completed: int
    dropped: int
    preemptions: int
    ttft_s: dict
    tpot_s: dict
    itl_s: dict
    e2e_s: dict
    queue_s: dict
    tokens_per_s: float          # output tokens / makespan
    requests_per_s: float        # completed requests / makespan
    total_tokens_per_s: float    # (prompt + output tokens of completed requests) / makespan
    makespan_s: float
    busy_fraction: float         # share of the makespan the accelerator was running a step
    busy_s: dict                 # seconds of decode-only, prefill-only and mixed (chunked) steps
    mean_batch: float            # time-weighted requests in a step (decodes + prefill chunks) while busy
    max_batch_seen: int
    mean_in_flight: float        # time-weighted requests admitted (holding KV memory) while busy
    max_in_flight: int
    steps: int
    kv_capacity_bytes: float
    peak_kv_bytes: float
    mean_kv_bytes: float         # time-weighted over the makespan
    kv_bytes: dict               # KV memory over time: time-weighted mean, p50, p90, p99 over the makespan
    weight_bytes: float
    peak_memory_bytes: float     # weights + peak KV (+ the analytic model's activation workspace)
    wall_s: float                # host seconds the simulation took
    # the tables' compact columns (numpy arrays); `requests` and `timeline` build DataFrames from them
    request_columns: dict = field(repr=False)
    timeline_columns: dict = field(repr=False)

    @cached_property
    def requests(self) -> pd.DataFrame:
        """One row per request (request_frame)."""
        return request_frame(self.request_columns)

    @cached_property
    def timeline(self) -> pd.DataFrame:
        """One row per step: start, duration, KV bytes held, batch, in flight, decodes, prefill tokens, waiting."""
        return pd.DataFrame(self.timeline_columns)

    def to_dict(self) -> dict:
        out = {k: v for k, v in self.__dict__.items() if k not in _TABLES}
        cols = self.request_columns
        reasons = [cols["drop_reason"][i] for i in np.flatnonzero(cols["status"] == DROPPED)]
        out["drop_reasons"] = pd.Series(reasons).value_counts().to_dict()   # as the table's column counts them
        return out

    def to_json(self, **kwargs) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    def to_row(self) -> dict:
        """Flat scalars (ttft_s_p99, ...) for one row of a sweep table."""
        row = {}
        for key, value in self.to_dict().items():
            if key in DISTRIBUTIONS:
                row.update({f"{key}_{stat}": value[stat] for stat in STAT_KEYS})
            elif key == "busy_s":
                row.update({f"busy_{kind}_s": seconds for kind, seconds in value.items()})
            elif key not in ("config", "drop_reasons"):
                row[key] = value
        return row


def steady_window(res: ServeResult) -> dict[str, float]:
    """The run's steady state: the window from the first completion (the first requests have lived a whole
    life, so the batch holds requests of every age) to the last admission (after it the batch only
    drains), and over it the time-weighted requests in flight, KV bytes held, and output tokens/s (one per
    decode, one per first token). What the analytic steady-state batch (sim.capacity.max_batch_steady) is
    compared with; NaN values when the run has no such window (nothing completed before the last admission)."""
    tl, req = res.timeline, res.requests
    done = req.completed.to_numpy()
    start = float(req.finish_s[done].min()) if done.any() else math.nan
    end = float(req.first_scheduled_s.max())
    t, dt = tl.t_s.to_numpy(), tl.dt_s.to_numpy()
    inside = (t >= start) & (t + dt <= end)
    span = float(dt[inside].sum())
    if not span > 0:
        return {"start_s": start, "end_s": end, "in_flight": math.nan, "kv_bytes": math.nan,
                "tokens_per_s": math.nan}
    first = req.first_token_s.to_numpy()
    firsts = int(((first >= t[inside].min()) & (first <= (t + dt)[inside].max())).sum())
    mean = lambda column: float((tl[column].to_numpy()[inside] * dt[inside]).sum() / span)
    return {"start_s": start, "end_s": end, "in_flight": mean("in_flight"), "kv_bytes": mean("kv_bytes"),
            "tokens_per_s": float((tl.decodes.to_numpy()[inside].sum() + firsts) / span)}


def _busy_by_kind(dt: np.ndarray, decodes: np.ndarray, prefill_tokens: np.ndarray) -> dict[str, float]:
    has_decode, has_prefill = decodes > 0, prefill_tokens > 0
    return {"decode": float(dt[has_decode & ~has_prefill].sum()),
            "prefill": float(dt[has_prefill & ~has_decode].sum()),
            "mixed": float(dt[has_decode & has_prefill].sum())}


def build_result(sched, timeline: dict[str, np.ndarray], *, config: dict, weight_bytes: float,
                 workspace_bytes: float, wall_s: float) -> ServeResult:
    """Metrics of a finished simulation from the scheduler's per-request arrays and the step timeline."""
    done = sched.status == DONE
    dropped = sched.status == DROPPED
    cols = request_columns(sched)
    lat = latencies(cols)
    arrival, finish, out_tokens = sched.arrival, sched.finish, sched.output
    t, dt = timeline["t_s"], timeline["dt_s"]
    kv_bytes = timeline["kv_blocks"] * sched.pool.block_bytes
    batch, in_flight = timeline["batch"], timeline["in_flight"]
    start = float(arrival.min())
    end = float(np.nanmax(finish)) if done.any() else start
    makespan = end - start
    busy = float(dt.sum())
    n_done = int(done.sum())
    out_done = float(out_tokens[done].sum())
    in_done = float(sched.prompt[done].sum())

    def rate(amount: float) -> float:
        return amount / makespan if makespan > 0 else float("nan")

    peak_kv = float(sched.pool.peak_blocks * sched.pool.block_bytes)
    return ServeResult(
        config=config, completed=n_done, dropped=int(dropped.sum()), preemptions=int(sched.total_preemptions),
        ttft_s=summarize(lat["ttft_s"][done]), tpot_s=summarize(lat["tpot_s"][done]), itl_s=summarize_runs(sched.itl),
        e2e_s=summarize(lat["e2e_s"][done]), queue_s=summarize(lat["queue_s"][done]),
        tokens_per_s=rate(out_done), requests_per_s=rate(n_done), total_tokens_per_s=rate(in_done + out_done),
        makespan_s=makespan, busy_fraction=busy / makespan if makespan > 0 else float("nan"),
        busy_s=_busy_by_kind(dt, timeline["decodes"], timeline["prefill_tokens"]),
        mean_batch=float((batch * dt).sum() / busy) if busy > 0 else 0.0,
        max_batch_seen=int(batch.max()) if len(batch) else 0,
        mean_in_flight=float((in_flight * dt).sum() / busy) if busy > 0 else 0.0,
        max_in_flight=int(in_flight.max()) if len(in_flight) else 0, steps=len(dt),
        kv_capacity_bytes=float(sched.pool.capacity_bytes), peak_kv_bytes=peak_kv,
        mean_kv_bytes=float((kv_bytes * dt).sum() / makespan) if makespan > 0 else 0.0,
        kv_bytes=summarize_over_time(kv_bytes, dt, idle_s=makespan - busy),
        weight_bytes=float(weight_bytes), peak_memory_bytes=float(weight_bytes + workspace_bytes + peak_kv),
        wall_s=wall_s, request_columns=cols,
        timeline_columns={"t_s": t, "dt_s": dt, "kv_bytes": kv_bytes, "batch": batch, "in_flight": in_flight,
                          "decodes": timeline["decodes"], "prefill_tokens": timeline["prefill_tokens"],
                          "waiting": timeline["waiting"]},
    )
