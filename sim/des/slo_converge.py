"""The SLO search's convergence stop (`find_max_qps(converge=TOL)`, `sim.serve --slo-converge TOL`): one run
per rate, as long as its P99s need, instead of fixed run lengths doubled at the bracket.

A run at rate q has the warm-up and tail of sim.des.slo and up to `max_requests` measured requests. It looks
at the prefixes of N = N0, 2 N0, 4 N0, ... measured requests (in arrival order): once the first N are all done,
their P99 TTFT and P99 TPOT and the verdict (meets / misses); once enough of them are already over a limit,
a miss (sim.des.slo's early stop, for that prefix). The run stops at the first prefix N_k (k >= 1) that
*converged*: the verdict equals that of N_(k-1), and either both are early misses or every limited P99 moved by
at most TOL of its value from N_(k-1) to N_k. A run reaching max_requests stops there, marked not converged.
The probe is the last prefix's (its `requests` is N_k).

Why it may differ from the default search: that one measures the bracket's rates at N and 2N in separate runs
and calls the answer stable when both lengths agree; here every rate carries its own length, so a rate far
from the limit stops after 2 N0 and one near it runs on until its P99 stops moving.
"""
from __future__ import annotations

import math

import numpy as np

from sim.des.scheduler import DONE, DROPPED
from sim.des.slo_probe import CHECK_EVERY, P99, Probe


class Converging:
    """The stop predicate of one converging run (sim.des.server's `stop`)."""

    def __init__(self, first: int, n0: int, max_requests: int, slo, tol: float):
        self.first, self.slo, self.tol = first, slo, tol
        self.sizes = [n0 * 2 ** k for k in range(64) if n0 * 2 ** k <= max(max_requests, n0)]
        self.k = 0
        self.steps = 0
        self.history: list[tuple[int, float, float, str | None, bool]] = []   # (N, ttft, tpot, problem, early)
        self.converged = False

    def _prefix(self, sched, now: float, n: int, check: bool):
        """(ttft_p99, tpot_p99, problem, early) of the first n measured requests, or None while undecided."""
        ids = np.arange(self.first, min(self.first + n, sched.n_requests))
        status = sched.status[ids]
        finished = (status == DONE) | (status == DROPPED)
        if not finished.all():
            if not check:
                return None
            return self._early_miss(sched, now, ids, status)
        if (status == DROPPED).any():
            return math.nan, math.nan, f"{int((status == DROPPED).sum())} measured requests dropped", True
        arrival, first = sched.arrival[ids], sched.first_token[ids]
        out = sched.output[ids]
        ttft = first - arrival
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot = np.where(out > 1, (sched.finish[ids] - first) / (out - 1), np.nan)
        p99 = lambda v: float(np.percentile(v[~np.isnan(v)], 99)) if (~np.isnan(v)).any() else math.nan
        ttft_p99, tpot_p99 = p99(ttft), p99(tpot)
        return ttft_p99, tpot_p99, self.slo.miss(ttft_p99, tpot_p99), False

    def _early_miss(self, sched, now, ids, status):
        enough = len(ids) - math.floor(P99 * (len(ids) - 1))
        arrival, first = sched.arrival[ids], sched.first_token[ids]
        ttft = np.where(np.isnan(first), np.where(arrival <= now, now - arrival, 0.0), first - arrival)
        end = np.where(status == DONE, sched.finish[ids], now)
        tpot = np.where(np.isnan(first) | (sched.output[ids] < 2), 0.0,
                        (end - first) / np.maximum(sched.output[ids] - 1, 1))
        for limit, values, name in ((self.slo.slo_ttft_p99, ttft, "TTFT"), (self.slo.slo_tpot_p99, tpot, "TPOT")):
            over = int((values > limit).sum()) if limit is not None else 0
            if over >= enough:
                return (math.nan, math.nan, f"stopped early: {over} of {len(ids)} measured requests already over the "
                        f"{name} limit, so their P99 > {limit:g} s", True)
        return None

    def _settled(self) -> bool:
        (_, t0, p0, miss0, early0), (_, t1, p1, miss1, early1) = self.history[-2:]
        if (miss0 is None) != (miss1 is None):
            return False
        if early0 and early1:
            return True
        if early0 or early1:
            return False
        for limit, before, now in ((self.slo.slo_ttft_p99, t0, t1), (self.slo.slo_tpot_p99, p0, p1)):
            if limit is not None and not abs(now - before) <= self.tol * abs(now):
                return False
        return True

    def __call__(self, sched, now: float) -> bool:
        self.steps += 1
        check = self.steps % CHECK_EVERY == 0
        while self.k < len(self.sizes):
            got = self._prefix(sched, now, self.sizes[self.k], check)
            if got is None:
                return False
            self.history.append((self.sizes[self.k], *got))
            self.k += 1
            if len(self.history) >= 2 and self._settled():
                self.converged = True
                return True
        return True

    def probe(self, qps: float) -> Probe:
        if not self.history:
            return Probe(qps, math.nan, math.nan, "no measured request finished", 0)
        n, ttft, tpot, problem, _ = self.history[-1]
        return Probe(qps, ttft, tpot, problem, n)
