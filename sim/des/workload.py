"""Replaying a request trace (sim.des.trace_file) as a serving workload: as recorded, a window of it,
time-scaled to a target rate, and with the requests longer than the model's context handled as asked.

- window `START:END` (seconds from the trace's first request; either side may be left out): the requests
  arriving in [START, END), shifted so the first of them arrives at t = 0;
- `qps`: every arrival time is multiplied by (the window's recorded rate / qps), so the gaps keep their
  shape (burstiness, diurnal swings) and only the rate moves; None replays the recorded times; inf sends
  every request at t = 0 (the SLO search's saturation probe);
- `requests`: the first N requests (after the window);
- overlong requests (prompt + output > `max_model_len`): `drop` removes them from the workload (a
  server rejects a prompt past its context), `clip` keeps them with the prompt cut to max_model_len - 1
  and the output to what then fits. Either way their number is in the workload's notes and the report.
"""
from __future__ import annotations

import math

import numpy as np

from kvcommon import FieldError
from sim.des.arrivals import Workload
from sim.des.trace_file import RequestTrace, load_trace

OVERLONG_MODES = ("drop", "clip")


def parse_window(text: str | None) -> tuple[float, float] | None:
    """'600:1200', ':600', '1800:' -> (start, end) seconds; None -> None. FieldError('window', ...)."""
    if text is None:
        return None
    start, sep, end = str(text).partition(":")
    if not sep:
        raise FieldError("window", "must be START:END in seconds (either may be left out)", text)
    try:
        lo = float(start) if start.strip() else 0.0
        hi = float(end) if end.strip() else math.inf
    except ValueError:
        raise FieldError("window", "must be START:END in seconds (either may be left out)", text) from None
    if not (lo >= 0 and math.isfinite(lo) and hi > lo):
        raise FieldError("window", "needs 0 <= START < END", text)
    return lo, hi


def check_window(text) -> str | None:
    """param() check of a window text."""
    try:
        parse_window(text)
    except FieldError as exc:
        return exc.problem
    return None


def _window(trace: RequestTrace, window: tuple[float, float] | None, text) -> np.ndarray:
    if window is None:
        return np.arange(len(trace))
    lo, hi = window
    keep = np.flatnonzero((trace.arrival_s >= lo) & (trace.arrival_s < hi))
    if not len(keep):
        raise FieldError("window", f"holds no request of {trace.name} (its requests arrive from 0 to "
                                   f"{trace.span_s:.1f} s)", text)
    return keep


def _overlong(prompt: np.ndarray, output: np.ndarray, max_model_len: int | None, mode: str):
    """(keep mask, prompt, output, count) with the overlong requests dropped or clipped."""
    keep = np.ones(len(prompt), dtype=bool)
    if max_model_len is None:
        return keep, prompt, output, 0
    over = prompt + output > max_model_len
    count = int(over.sum())
    if mode == "drop":
        return ~over, prompt, output, count
    prompt = np.minimum(prompt, max_model_len - 1)
    output = np.maximum(np.minimum(output, max_model_len - prompt), 1)
    return keep, prompt, output, count


def replay_workload(spec, *, qps: float | None = None, window: str | None = None, requests: int | None = None,
                    max_model_len: int | None = None, overlong: str = "drop") -> Workload:
    """A trace (bundled name, path or a loaded RequestTrace) -> Workload; errors name the fields."""
    if overlong not in OVERLONG_MODES:
        raise FieldError("overlong", f"must be one of {', '.join(OVERLONG_MODES)}", overlong)
    if qps is not None and not qps > 0:
        raise FieldError("qps", "must be > 0 (or inf)", qps)
    if requests is not None and requests < 1:
        raise FieldError("requests", "must be >= 1", requests)
    if max_model_len is not None and max_model_len < 2:
        raise FieldError("max_model_len", "must be >= 2", max_model_len)
    trace = spec if isinstance(spec, RequestTrace) else load_trace(spec)
    rows = _window(trace, parse_window(window), window)
    if requests is not None:
        rows = rows[:requests]
    arrival = trace.arrival_s[rows] - trace.arrival_s[rows[0]]
    keep, prompt, output, n_over = _overlong(trace.prompt_tokens[rows], trace.output_tokens[rows],
                                             max_model_len, overlong)
    if not keep.any():
        raise FieldError("max_model_len", f"leaves none of the {len(rows)} requests (all overlong, dropped)",
                         max_model_len)
    recorded = (len(rows) - 1) / arrival[-1] if arrival[-1] > 0 else math.inf
    scale = 1.0 if qps is None or math.isinf(recorded) else recorded / qps
    arrival = np.zeros(len(rows)) if qps is not None and math.isinf(qps) else arrival * scale
    arrival, prompt, output = arrival[keep], prompt[keep], output[keep]
    arrival = arrival - arrival[0]
    notes = {"trace": trace.name, "trace_requests": len(trace), "recorded_qps": recorded,
             "time_scale": scale if qps is None or not math.isinf(qps) else 0.0,
             "window_s": [float(trace.arrival_s[rows[0]]), float(trace.arrival_s[rows[-1]])],
             "max_model_len": max_model_len, "overlong": overlong, "overlong_requests": n_over}
    if trace.attribution:
        notes["attribution"] = trace.attribution
    return Workload(arrival, prompt.astype(np.int64), output.astype(np.int64), describe(notes, qps), notes)


def describe(notes: dict, qps: float | None) -> str:
    """One line: which trace, which part, at which rate, and what happened to overlong requests."""
    lo, hi = notes["window_s"]
    text = f"trace {notes['trace']} ({lo:.0f}-{hi:.0f} s, recorded {notes['recorded_qps']:.3g} req/s"
    if qps is None:
        text += ", as recorded)"
    elif math.isinf(qps):
        text += ", every request at t = 0)"
    else:
        text += f", time-scaled x{notes['time_scale']:.3g})"
    if notes["overlong_requests"]:
        verb = "dropped" if notes["overlong"] == "drop" else "clipped"
        text += f"; {notes['overlong_requests']} requests over {notes['max_model_len']} tokens {verb}"
    return text
