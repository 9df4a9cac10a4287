"""The highest request rate that meets a latency SLO at steady state (Vidur's capacity question, answered
per policy and cache ratio): a bracketing search over log qps of sim.serve runs, each measuring steady state.

A rate *meets* the SLO when none of the measured requests is dropped and their P99 TTFT and P99 TPOT are at
most the limits given (either limit may be left out).

Steady state, not a short run's start: a run that starts empty and serves its first 64 requests never
fills, so a short run overstates the sustainable rate 2-3x (issue 27: Llama-2-7B 4096+256 on H200, 7.96
req/s with 64 requests, 3.35 with 3,000). Each run at rate q therefore
- warms up: the requests arriving in the first WARMUP_LIVES service lives (`life_s`, the median time a
  request spends admitted when every request arrives at once: the longest a request is served) are served
  but not measured;
- measures the next N requests, while arrivals continue for TAIL_LIVES lives after them so that the last
  measured ones still decode in a loaded batch; the run stops once every measured request is done, or as
  soon as enough of them already miss a limit that their P99 must miss it too (early stop);
- the answer is *stable* when the bracket found with N measured requests, [low, high] with high / low <=
  1 + rel_tol, still holds with 2N (low meets, high misses); otherwise the search re-brackets at 2N and
  checks at 4N, up to MAX_REQUESTS. Doubling runs only at the bracket's two rates.
The result says which length settled it (`requests`), the warm-up, and whether it is stable.

The search: (1) every request at once (qps = inf) gives the saturated rate as the first guess and the
service life (if that burst meets the SLO at N and 2N requests the capacity is unbounded, `inf`); (2) from
the guess, doubles or halves the rate until one meets and one misses (0 with its reason when no rate down
to guess / 2**MAX_HALVINGS meets it); (3) bisects geometrically to rel_tol; (4) checks by doubling.
The arrival times of one seed scale exactly with 1 / qps (the Poisson gaps are one set of exponential draws
divided by the rate), so the latencies grow (nearly) monotonically with the rate and the search is
deterministic.

Speed without changing an answer: `workers` processes (the CLI: both cores) run, besides the rate the
search needs, the one it needs next either way of a bisection (the side the last probe went first), the
next of an expansion and the second rate of a bracket check; guesses it moves past are stopped
(sim.des.slo_runs). The runs' step times come from timers shared by every run of one configuration
(sim.des.serving: their memos are pure functions of the step), and a run's stop test reads one status a
step. The probes, their order and the answer are the serial search's (Llama-2-7B 4096 + 256 on H200, P99
TTFT <= 2 s and TPOT <= 50 ms: 2.816 req/s, 27 simulations, 62 s before, 38 s on two cores).

`converge=TOL` (`--slo-converge`) replaces the fixed lengths and their doubling with one run per rate that
stops once its P99s converge (sim.des.slo_converge states the criterion); it may move the answer (on that
point, TOL 0.05: 2.854 req/s, +1.4%, 7 simulations, 43 s, the runs near the answer not converged by 3,200).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from kvcommon.fields import above, param, validate
from sim.des import slo_runs
from sim.des.arrivals import ARRIVAL_KINDS
from sim.des.slo_probe import Probe, _Measured  # noqa: F401  (this module's public names, as before)
from sim.des.slo_runs import Runs

MAX_HALVINGS = 12
DEFAULT_REL_TOL = 0.05
START_REQUESTS = 200          # measured requests per run at the first length
MAX_REQUESTS = 3200           # the longest length doubling goes to
# decode steps timed on sim.des.step_grid's interpolation grid (relative error < 1e-4, far inside the
# search's tolerance; about twice as fast) unless the configuration chose its own
SEARCH_STEP_GRID = 64
WARMUP_LIVES = 2.0            # warm-up: arrivals in this many service lives are not measured
TAIL_LIVES = 1.5              # arrivals continue this many lives after the last measured one


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
        """Why the run `res` (a ServeResult, all its requests) misses the SLO, or None when it meets it."""
        if res.dropped:
            return f"{res.dropped} requests dropped"
        return self.miss(res.ttft_s["p99"], res.tpot_s["p99"])

    def miss(self, ttft_p99, tpot_p99) -> str | None:
        """Why these P99s miss the SLO, or None when they meet it (NaN: nothing completed, a miss)."""
        for limit, value, name in ((self.slo_ttft_p99, ttft_p99, "TTFT"), (self.slo_tpot_p99, tpot_p99, "TPOT")):
            if limit is not None and not (value is not None and value <= limit):
                return f"P99 {name} {value:.4g} s > {limit:g} s" if value is not None else f"no P99 {name}"
        return None

    def describe(self) -> str:
        parts = [f"P99 {name} <= {v:g} s" for name, v in (("TTFT", self.slo_ttft_p99), ("TPOT", self.slo_tpot_p99))
                 if v is not None]
        return " and ".join(parts)


@dataclass
class SearchResult:
    max_qps: float                     # the highest rate found to meet the SLO (inf: all at once meets it; 0: none)
    fail_qps: float | None             # the lowest rate found to miss it (the bracket's top), None when inf
    runs: int                          # serving simulations run
    at_max: object | None              # ServeResult at max_qps (None when no rate met the SLO)
    reason: str                        # what bounds the search (the miss at fail_qps, or why none met)
    probes: list = field(default_factory=list)
    requests: int = 0                  # requests measured per run at the length that settled the answer
    warmup_s: float = 0.0              # arrivals in the first warmup_s seconds of a run are not measured
    stable: bool = False               # the bracket held at `requests` and at half of it
    criterion: str = ""                # how the search decided, in words

    def to_dict(self) -> dict:
        out = {"max_qps": self.max_qps, "fail_qps": self.fail_qps, "runs": self.runs, "reason": self.reason,
               "steady_state": {"requests": self.requests, "warmup_s": self.warmup_s, "stable": self.stable,
                                "criterion": self.criterion},
               "probes": [vars(p) for p in self.probes]}
        if self.at_max is not None:
            at = next(p for p in reversed(self.probes) if p.qps == self.max_qps and p.ok)
            out.update(ttft_s_p99=at.ttft_p99, tpot_s_p99=at.tpot_p99,
                       tokens_per_s=self.at_max.tokens_per_s, requests_per_s=self.at_max.requests_per_s)
        return out


def find_max_qps(cfg, slo: SLO, *, rel_tol: float = DEFAULT_REL_TOL, requests: int | None = None,
                 max_requests: int = MAX_REQUESTS, max_runs: int = 40, workers: int = 1,
                 converge: float | None = None) -> SearchResult:
    """The highest Poisson (or gamma) rate of `cfg` (a ServeConfig; its qps and requests are not used) that
    meets `slo` at steady state; `requests`: measured requests per run at the first length (default
    START_REQUESTS), doubled until the answer is stable to rel_tol or max_requests is reached; `workers`:
    processes running the simulations (sim.des.slo_runs; the same answer and probes with any number);
    `converge`: one run per rate, stopped once its P99s move by at most this fraction when its measured
    requests double (sim.des.slo_converge), instead of the bracket's re-runs at doubled lengths."""
    if not slo.given:
        raise ValueError("the search needs an SLO: slo_ttft_p99 and/or slo_tpot_p99")
    if cfg.arrivals not in ARRIVAL_KINDS:
        raise ValueError("the search varies the request rate: arrivals must be poisson or gamma, not a replay file")
    if not (rel_tol > 0):
        raise ValueError(f"rel_tol must be > 0, got {rel_tol}")
    if converge is not None and not (0 < converge < 1):
        raise ValueError(f"converge must be in (0, 1), got {converge}")
    n = int(requests or START_REQUESTS)
    if n < 1:
        raise ValueError(f"requests must be >= 1, got {n}")
    max_requests = max(max_requests, 2 * n)
    if getattr(cfg, "step_grid", None) is None:
        cfg = replace(cfg, step_grid=SEARCH_STEP_GRID)
    runs = Runs(workers)
    try:
        return _search(cfg, slo, rel_tol, n, max_requests, max_runs, runs, converge)
    finally:
        runs.close()


def _search(cfg, slo: SLO, rel_tol: float, n: int, max_requests: int, max_runs: int, runs: Runs,
            converge: float | None) -> SearchResult:
    probes, results, probe_at, converged = [], {}, {}, {}

    def burst(count: int) -> Probe:
        # in this process: it loads the device, model and step-time caches the forked workers then inherit
        probe, res = slo_runs.burst(cfg, slo, count)
        probes.append(probe)
        results[(math.inf, count)] = res
        return probe

    first = burst(n)
    res = results[(math.inf, n)]
    req = res.requests[res.requests.completed]
    life = float(np.median(req.finish_s - req.first_scheduled_s)) if len(req) else math.nan
    warmup_s = WARMUP_LIVES * life if math.isfinite(life) else 0.0
    criterion = (f"steady state: each run serves the arrivals of its first {warmup_s:.3g} s ({WARMUP_LIVES:g} "
                 f"service lives of {life:.3g} s) unmeasured, measures the next N requests with arrivals going on "
                 f"{TAIL_LIVES:g} lives past them, and stops once they are done or their P99 already misses; "
                 f"stable when the bracket (within {rel_tol:.0%}) holds at N and 2N")
    if converge is not None:
        criterion = (f"steady state: each run serves the arrivals of its first {warmup_s:.3g} s ({WARMUP_LIVES:g} "
                     f"service lives of {life:.3g} s) unmeasured, then looks at its first N = {n}, {2 * n}, ... "
                     f"measured requests (up to {max_requests}, arrivals going on {TAIL_LIVES:g} lives past "
                     f"them) and stops at the first N whose verdict equals that of N / 2 with every limited P99 "
                     f"within {converge:.0%} of it (or two early misses); stable when both ends of the bracket "
                     f"(within {rel_tol:.0%}) converged")

    def args(qps: float, count: int) -> tuple:
        if converge is not None:
            return (qps, count), slo_runs.converge_measure, (cfg, slo, qps, count, max_requests, warmup_s, life,
                                                             TAIL_LIVES, converge)
        return (qps, count), slo_runs.measure, (cfg, slo, qps, count, warmup_s, life, TAIL_LIVES)

    def run(qps: float, count: int, *ahead: float) -> Probe:
        """The probe at (qps, count); `ahead`: rates the search may ask for next at this length, started
        meanwhile on idle workers."""
        if (qps, count) in results:
            return probe_at[(qps, count)]
        runs.want([args(q, count) for q in (qps, *ahead) if (q, count) not in results])
        probe, res, *settled = runs.get(*args(qps, count))
        probes.append(probe)
        results[(qps, count)] = res
        probe_at[(qps, count)] = probe
        converged[qps] = bool(settled and settled[0])
        return probe

    def done(max_qps, fail_qps, reason, count, stable):
        at = results.get((max_qps, count))
        if converge is not None:    # the length that settled it: the longest of the bracket's runs
            count = max((probe_at[(q, count)].requests for q in (max_qps, fail_qps) if (q, count) in probe_at),
                        default=count)
        return SearchResult(max_qps, fail_qps, len(probes), at, reason, probes, count, warmup_s, stable, criterion)

    if first.ok:
        if 2 * n <= max_requests and burst(2 * n).ok:
            return done(math.inf, None, f"every request at once meets the SLO ({n} and {2 * n} requests)",
                        2 * n, True)
        if 2 * n > max_requests:
            return done(math.inf, None, f"every request at once meets the SLO ({n} requests)", n, False)
    guess = res.requests_per_s
    if not (guess > 0 and math.isfinite(guess)):
        return done(0.0, math.inf, f"at qps inf: {first.problem}; no request completed", n, False)

    def bracket(low, high, count, factor):
        """Expand from the known side by `factor` until one rate meets and one misses at `count`."""
        while (low is None or high is None) and len(probes) < max_runs:
            if low is None:
                q = high / factor
                if q < guess / 2 ** MAX_HALVINGS:
                    return None, high
                low, high = (q, high) if run(q, count, q / factor).ok else (None, q)
            else:
                q = low * factor
                low, high = (q, None) if run(q, count, q * factor).ok else (low, q)
        return low, high

    def bisect(low, high, count):
        while high / low > 1 + rel_tol and len(probes) < max_runs:
            mid = math.sqrt(low * high)
            # ahead: the serial search's next rate either way, the side the last probe went first (verdicts
            # near the answer come in runs: the re-bracketing below starts under it and steps up)
            below, above = math.sqrt(low * mid), math.sqrt(mid * high)
            ahead = (above, below) if probes[-1].ok else (below, above)
            low, high = (mid, high) if run(mid, count, *ahead).ok else (low, mid)
        return low, high

    low, high = (guess, None) if run(guess, n, guess / 2).ok else (None, guess)
    low, high = bracket(low, high, n, 2.0)
    stable = False
    while True:
        if low is None:
            last = probes[-1]
            return done(0.0, last.qps, f"no rate down to {last.qps:.4g} req/s meets it: {last.problem}", n, False)
        if high is None:
            return done(low, math.inf, "run limit reached", n, False)
        low, high = bisect(low, high, n)
        if converge is not None:    # every run measured as long as its P99s needed: nothing to recheck
            stable = converged.get(low, False) and converged.get(high, False)
            miss = probe_at[(high, n)].problem
            reason = f"at {high:.4g} req/s: {miss}" + ("" if stable else "; not converged at both ends within "
                                                        f"{max_requests} measured requests")
            return done(low, high, reason, n, stable)
        if 2 * n > max_requests or len(probes) >= max_runs:
            break
        n *= 2
        meets, misses = run(low, n, high).ok, not run(high, n).ok
        if meets and misses:
            stable = True
            break
        # the bracket moved with the longer runs: re-bracket there from the rate that changed side
        low, high = (None, low) if not meets else (high, None)
        low, high = bracket(low, high, n, 1 + 4 * rel_tol)
    miss = next((p.problem for p in probes if p.qps == high and p.requests == n), None)
    reason = f"at {high:.4g} req/s: {miss}" if miss else "run limit reached"
    if not stable:
        reason += f"; not shown stable: the bracket was not rechecked at {2 * n} requests (limit {max_requests})"
    return done(low, high, reason, n, stable)
