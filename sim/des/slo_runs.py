"""The SLO search's simulations (sim.des.slo): one run per (rate, measured requests), in this process or on
worker processes.

With workers, the search names the runs it needs now and the ones it may need next (`want`: the next rate of
a bisection either way, the next of an expansion, the second rate of a bracket check); they start on free
workers, and a guess the search has moved past is stopped. A run's result depends only on its
configuration, rate and length (seeded arrivals, pure step times), never on which process ran it or when,
and the search reads results in the order it asks for them, so its answer, probes and their order are the
serial search's; a guess it never asks for costs worker time, not the wait for a run it needs.
"""
from __future__ import annotations

import math
import multiprocessing
from dataclasses import replace
from multiprocessing.connection import wait

from sim.runner.forked import can_fork, child


def burst(cfg, slo, count: int):
    """Every request at once: (Probe, ServeResult)."""
    from sim.des.serving import run_config
    from sim.des.slo_probe import Probe
    res = run_config(replace(cfg, qps=math.inf, requests=count))
    return Probe(math.inf, float(res.ttft_s["p99"]), float(res.tpot_s["p99"]), slo.problem(res), count), res


def measure(cfg, slo, qps: float, count: int, warmup_s: float, life: float, tail_lives: float):
    """A steady-state run at `qps`: the warm-up's arrivals unmeasured, then `count` measured requests, with
    arrivals going on `tail_lives` service lives after them; (Probe, ServeResult)."""
    from sim.des.serving import run_config
    from sim.des.slo_probe import _Measured
    warm = int(math.ceil(qps * warmup_s))
    tail = int(math.ceil(qps * tail_lives * life)) + 1 if math.isfinite(life) else count
    measured = _Measured(warm, count, slo)
    res = run_config(replace(cfg, qps=qps, requests=warm + count + tail), stop=measured)
    return measured.probe(qps, res), res


def converge_measure(cfg, slo, qps: float, n0: int, max_requests: int, warmup_s: float, life: float,
                     tail_lives: float, tol: float):
    """One run at `qps` measured until its P99s converge (sim.des.slo_converge): (Probe, ServeResult, converged)."""
    from sim.des.serving import run_config
    from sim.des.slo_converge import Converging
    warm = int(math.ceil(qps * warmup_s))
    tail = int(math.ceil(qps * tail_lives * life)) + 1 if math.isfinite(life) else max_requests
    stop = Converging(warm, n0, max_requests, slo, tol)
    res = run_config(replace(cfg, qps=qps, requests=warm + max_requests + tail), stop=stop)
    return stop.probe(qps), res, stop.converged


def default_workers() -> int:
    """Both cores of a two-core machine (at most 2: a bisection has little to run ahead); one inside a worker
    process of something else (a daemon process cannot start its own) or where processes cannot fork."""
    if not can_fork():
        return 1
    return max(1, min(2, multiprocessing.cpu_count()))


class Runs:
    """Runs by key. `want(keys)` names, in order, the runs the search needs now and may need next: the first
    ones start on free workers (one forked process each), and a run still going that is no longer wanted is
    stopped, so guesses never hold a worker the search needs. One worker: each run in this process."""

    def __init__(self, workers: int = 1):
        forkable = can_fork()
        self.workers = max(1, int(workers)) if forkable else 1
        # fork: the children inherit the loaded models, devices and step-time memos
        self._ctx = multiprocessing.get_context("fork") if forkable else None
        self._running: dict = {}           # key -> (process, connection)
        self._results: dict = {}           # key -> (ok, value) of finished runs not yet taken

    def _spawn(self, key, fn, args) -> None:
        receive, send = self._ctx.Pipe(duplex=False)
        process = self._ctx.Process(target=child, args=(send, fn, args), daemon=True)
        process.start()
        send.close()
        self._running[key] = (process, receive)

    def _stop(self, key) -> None:
        process, conn = self._running.pop(key)
        process.terminate()
        process.join()
        conn.close()

    def _collect(self, timeout=None) -> None:
        """Take the results of finished runs (waiting up to `timeout` for one)."""
        conns = {conn: key for key, (_, conn) in self._running.items()}
        for conn in wait(list(conns), timeout):
            key = conns[conn]
            process, _ = self._running.pop(key)
            try:
                self._results[key] = conn.recv()
            except EOFError:              # the child died without a word (killed from outside)
                self._results[key] = (False, RuntimeError(f"simulation {key} ended without a result"))
            conn.close()
            process.join()

    def want(self, wanted: list) -> None:
        """wanted: (key, fn, args) in order of need; the first is needed now."""
        if self.workers == 1:
            return
        keys = {key for key, _, _ in wanted}
        for key in [k for k in self._running if k not in keys]:
            self._stop(key)
        self._collect(timeout=0)
        for key, fn, args in wanted:
            if len(self._running) >= self.workers:
                break
            if key not in self._running and key not in self._results:
                self._spawn(key, fn, args)

    def get(self, key, fn, args):
        """fn(*args) of the run `key` (after `want`, from its worker)."""
        if self.workers == 1:
            return fn(*args)
        if key not in self._running and key not in self._results:
            self._spawn(key, fn, args)
        while key not in self._results:
            self._collect()
        ok, value = self._results.pop(key)
        if not ok:
            raise value
        return value

    def close(self) -> None:
        """Stop the runs still going (guesses the search did not need)."""
        for key in list(self._running):
            self._stop(key)
        self._results.clear()
