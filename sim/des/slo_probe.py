"""What one run of the SLO search (sim.des.slo) measures: its `Probe` (the rate, the measured requests' P99
TTFT and TPOT, why it misses) and its stop test (`_Measured`: every measured request done, or so many already
over a limit that their P99 is over it whatever the others do)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sim.des.scheduler import DONE, DROPPED

CHECK_EVERY = 16              # steps between two early-stop checks
P99 = 0.99


@dataclass
class Probe:
    qps: float
    ttft_p99: float
    tpot_p99: float
    problem: str | None
    requests: int = 0                  # requests measured (after the warm-up)

    @property
    def ok(self) -> bool:
        return self.problem is None



class _Measured:
    """The requests one run measures (ids first..first + n - 1) and its early stop: every one of them done,
    or so many already over a limit that their P99 is over it whatever the others do."""

    def __init__(self, first: int, n: int, slo: SLO):
        self.ids = np.arange(first, first + n)
        self.slo = slo
        # P99 (linear interpolation, as numpy) of n values exceeds a limit once n - floor(0.99 (n - 1)) do
        self.enough = n - math.floor(P99 * (n - 1))
        self.steps = 0
        self._open = first      # every measured request before this one is done or dropped
        self.why: str | None = None

    def _fit(self, n_requests: int) -> None:
        """A replayed finite trace may hold fewer requests than asked for: measure those it has."""
        if len(self.ids) and self.ids[-1] >= n_requests:
            self.ids = self.ids[self.ids < n_requests]
            self.enough = len(self.ids) - math.floor(P99 * (len(self.ids) - 1)) if len(self.ids) else 1
            if not len(self.ids):
                self.why = "the trace ends before the measured requests (all of it is warm-up)"

    def _all_finished(self, status: np.ndarray) -> bool:
        """Every measured request done or dropped (a request never leaves those states, so the scan resumes
        where it stopped: O(1) a step instead of reading all n statuses)."""
        end = int(self.ids[-1]) + 1
        while self._open < end and (status[self._open] == DONE or status[self._open] == DROPPED):
            self._open += 1
        return self._open >= end

    def __call__(self, sched, now: float) -> bool:
        self.steps += 1
        self._fit(sched.n_requests)
        if not len(self.ids):
            return True
        if self.steps % CHECK_EVERY and not self._all_finished(sched.status):
            return False
        status = sched.status[self.ids]
        if np.any(status == DROPPED):
            self.why = f"{int((status == DROPPED).sum())} measured requests dropped"
            return True
        if np.all(status == DONE):
            return True
        arrival, first = sched.arrival[self.ids], sched.first_token[self.ids]
        arrived = arrival <= now
        ttft = np.where(np.isnan(first), np.where(arrived, now - arrival, 0.0), first - arrival)
        # TPOT so far is a lower bound of the final one: (now or finish - first token) / (tokens - 1)
        end = np.where(status == DONE, sched.finish[self.ids], now)
        out = np.maximum(sched.output[self.ids] - 1, 1)
        tpot = np.where(np.isnan(first) | (sched.output[self.ids] < 2), 0.0, (end - first) / out)
        for limit, values, name in ((self.slo.slo_ttft_p99, ttft, "TTFT"), (self.slo.slo_tpot_p99, tpot, "TPOT")):
            over = int((values > limit).sum()) if limit is not None else 0
            if over >= self.enough:
                self.why = (f"stopped early: {over} of {len(self.ids)} measured requests already over the "
                            f"{name} limit, so their P99 > {limit:g} s")
                return True
        return False

    def probe(self, qps: float, res) -> Probe:
        self._fit(len(res.requests))
        frame = res.requests.iloc[self.ids]
        done = frame[frame.completed]
        p99 = lambda col: float(np.percentile(done[col].dropna(), 99)) if done[col].notna().any() else math.nan
        ttft, tpot = p99("ttft_s"), p99("tpot_s")
        problem = self.why
        if problem is None and len(done) < len(frame):
            problem = f"{len(frame) - len(done)} measured requests not completed"
        return Probe(qps, ttft, tpot, problem or self.slo.miss(ttft, tpot), len(self.ids))
