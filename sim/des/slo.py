"""The highest request rate that meets a latency SLO (Vidur's capacity question, answered per policy and
cache ratio): a bracketing search over log qps of sim.serve runs.

A rate *meets* the SLO when every request completes (none dropped) and the run's P99 TTFT and P99 TPOT are
at most the limits given (either limit may be left out). The search:

1. runs every request at once (qps = inf): if that meets the SLO the capacity is unbounded (`inf`); its
   request throughput (the saturated rate) is the first guess;
2. brackets: from the guess, doubles the rate until one fails or halves it until one meets (a run with no
   rate down to guess / 2**MAX_HALVINGS meeting the SLO reports 0 and why, e.g. one request alone already
   takes longer than the TTFT limit);
3. bisects the bracket geometrically until high / low <= 1 + rel_tol.

The arrival times of one seed scale exactly with 1 / qps (the Poisson gaps are one set of exponential
draws divided by the rate), so the latencies grow (nearly) monotonically with the rate and the search is
deterministic. A finite run of N requests measures the first N requests' latencies: above the sustainable
rate the queue, and so the P99 TTFT, grows with N, so more requests give a sharper (lower) capacity.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from kvcommon.fields import above, param, validate
from sim.des.arrivals import ARRIVAL_KINDS

MAX_HALVINGS = 12
DEFAULT_REL_TOL = 0.05


@dataclass(frozen=True)
class SLO:
    """Latency limits in seconds (None: no limit on that metric)."""
    slo_ttft_p99: float | None = param(None, check=above(0), metavar="S",
                                       help="SLO: P99 time to first token limit in seconds")
    slo_tpot_p99: float | None = param(None, check=above(0), metavar="S",
                                       help="SLO: P99 time per output token limit in seconds")

    def __post_init__(self):
        validate(self)

    @property
    def given(self) -> bool:
        return self.slo_ttft_p99 is not None or self.slo_tpot_p99 is not None

    def problem(self, res) -> str | None:
        """Why the run `res` (a ServeResult) misses the SLO, or None when it meets it."""
        if res.dropped:
            return f"{res.dropped} requests dropped"
        for limit, stats, name in ((self.slo_ttft_p99, res.ttft_s, "TTFT"), (self.slo_tpot_p99, res.tpot_s, "TPOT")):
            value = stats["p99"]
            if limit is not None and not (value <= limit):    # NaN (nothing completed) fails too
                return f"P99 {name} {value:.4g} s > {limit:g} s"
        return None

    def describe(self) -> str:
        parts = [f"P99 {name} <= {v:g} s" for name, v in (("TTFT", self.slo_ttft_p99), ("TPOT", self.slo_tpot_p99))
                 if v is not None]
        return " and ".join(parts)


@dataclass
class Probe:
    qps: float
    ttft_p99: float
    tpot_p99: float
    problem: str | None

    @property
    def ok(self) -> bool:
        return self.problem is None


@dataclass
class SearchResult:
    max_qps: float                     # the highest rate found to meet the SLO (inf: all at once meets it; 0: none)
    fail_qps: float | None             # the lowest rate found to miss it (the bracket's top), None when inf
    runs: int                          # serving simulations run
    at_max: object | None              # ServeResult at max_qps (None when no rate met the SLO)
    reason: str                        # what bounds the search (the miss at fail_qps, or why none met)
    probes: list = field(default_factory=list)

    def to_dict(self) -> dict:
        out = {"max_qps": self.max_qps, "fail_qps": self.fail_qps, "runs": self.runs, "reason": self.reason,
               "probes": [vars(p) for p in self.probes]}
        if self.at_max is not None:
            out.update(ttft_s_p99=self.at_max.ttft_s["p99"], tpot_s_p99=self.at_max.tpot_s["p99"],
                       tokens_per_s=self.at_max.tokens_per_s, requests_per_s=self.at_max.requests_per_s)
        return out


def find_max_qps(cfg, slo: SLO, *, rel_tol: float = DEFAULT_REL_TOL, max_runs: int = 40) -> SearchResult:
    """The highest Poisson (or gamma) rate of `cfg` (a ServeConfig; its qps is ignored) meeting `slo`."""
    from sim.des.serving import run_config
    if not slo.given:
        raise ValueError("the search needs an SLO: slo_ttft_p99 and/or slo_tpot_p99")
    if cfg.arrivals not in ARRIVAL_KINDS:
        raise ValueError("the search varies the request rate: arrivals must be poisson or gamma, not a replay file")
    if not (rel_tol > 0):
        raise ValueError(f"rel_tol must be > 0, got {rel_tol}")
    probes, results = [], {}

    def run(qps: float) -> Probe:
        res = run_config(replace(cfg, qps=qps))
        probe = Probe(qps, float(res.ttft_s["p99"]), float(res.tpot_s["p99"]), slo.problem(res))
        probes.append(probe)
        results[qps] = res
        return probe

    def done(max_qps, fail_qps, reason):
        return SearchResult(max_qps, fail_qps, len(probes), results.get(max_qps), reason, probes)

    burst = run(math.inf)
    if burst.ok:
        return done(math.inf, None, "every request at once meets the SLO")
    guess = results[math.inf].requests_per_s
    if not (guess > 0 and math.isfinite(guess)):
        return done(0.0, math.inf, f"at qps inf: {burst.problem}; no request completed")
    low = high = None
    probe = run(guess)
    if probe.ok:
        low = guess
        while high is None and len(probes) < max_runs:
            q = low * 2
            if run(q).ok:
                low = q
            else:
                high = q
        if high is None:
            high = math.inf
    else:
        high = guess
        for _ in range(MAX_HALVINGS):
            q = high / 2
            if run(q).ok:
                low = q
                break
            high = q
        if low is None:
            last = probes[-1]
            return done(0.0, last.qps, f"no rate down to {last.qps:.4g} req/s meets it: {last.problem}")
    while math.isfinite(high) and high / low > 1 + rel_tol and len(probes) < max_runs:
        mid = math.sqrt(low * high)
        if run(mid).ok:
            low = mid
        else:
            high = mid
    miss = next((p.problem for p in probes if p.qps == high), None)
    return done(low, high, f"at {high:.4g} req/s: {miss}" if miss else "run limit reached")
