"""The simpy model of one accelerator serving requests.

Two processes share a simpy Environment:
- `arrivals` releases each request into the scheduler's queue at its arrival time and wakes the engine
  when it is idle;
- `engine` is the accelerator: it runs one forward pass at a time (the GPU executes one batched step
  after another), asks the scheduler what to run, holds simulated time for as long as the step-time
  model says (compute and memory bandwidth enter there: every operator takes
  max(FLOPs / achievable FLOP/s, bytes / achievable bandwidth)), then applies the step's effects.

One simpy event per step, not per token: a decode step advances every running request by one token
with a few numpy operations on the batch (see sim.des.scheduler).

A `stop(scheduler, now)` predicate, asked after every step, ends the run early (the SLO search stops once
the requests it measures are done, or once they already miss the SLO); requests then left unfinished are
neither completed nor dropped.
"""
from __future__ import annotations

import time
from typing import Callable, Protocol

import numpy as np
import simpy

from .scheduler import Scheduler, StepPlan


class StepTimer(Protocol):
    """Seconds one forward pass takes. `kv` = tokens held per KV head by each decode request;
    `chunks` = prefill chunks (new_tokens, past_tokens)."""

    def decode(self, kv: np.ndarray) -> float: ...

    def prefill(self, chunks: list[tuple[int, int]]) -> float: ...

    def mixed(self, kv: np.ndarray, chunks: list[tuple[int, int]]) -> float: ...


def step_seconds(timer: StepTimer, plan: StepPlan) -> float:
    if not plan.prefill:
        return timer.decode(plan.decode_kv)
    if not len(plan.decode_ids):
        return timer.prefill(plan.prefill_chunks)
    return timer.mixed(plan.decode_kv, plan.prefill_chunks)


class ServingSimulation:
    def __init__(self, scheduler: Scheduler, timer: StepTimer, *, progress: bool = False,
                 progress_desc: str = "simulating", check_every_step: bool = False,
                 stop: Callable[[Scheduler, float], bool] | None = None):
        self.sched = scheduler
        self._stop = stop
        self.stopped = False                      # ended by `stop` before every request was served
        self.timer = timer
        self.env = simpy.Environment()
        self._idle: simpy.Event | None = None
        self._arrivals_done = False
        self.check_every_step = check_every_step  # tests: verify memory invariants after every step
        self._progress = progress
        self._progress_desc = progress_desc
        cols = ("t_s", "dt_s", "kv_blocks", "batch", "in_flight", "decodes", "prefill_tokens", "waiting")
        self._timeline: dict[str, list] = {c: [] for c in cols}

    # ---- processes ---------------------------------------------------------------------------------
    def _arrivals(self):
        sched, arrival = self.sched, self.sched.arrival
        i, n = 0, sched.n_requests
        while i < n:
            if arrival[i] > self.env.now:
                yield self.env.timeout(arrival[i] - self.env.now)
            # release every request due by now in one go (bursts cost one event)
            while i < n and arrival[i] <= self.env.now:
                sched.arrive(i, self.env.now)
                i += 1
            self._wake()
        self._arrivals_done = True

    def _wake(self):
        if self._idle is not None and not self._idle.triggered:
            self._idle.succeed()

    def _engine(self, bar):
        sched, env, tl = self.sched, self.env, self._timeline
        while True:
            plan = sched.plan_step(env.now)
            if plan is None:
                if self._arrivals_done and not sched.has_work():
                    return
                self._idle = env.event()
                yield self._idle
                continue
            dt = step_seconds(self.timer, plan)
            if not (dt > 0 and np.isfinite(dt)):
                raise AssertionError(f"step time model returned {dt!r} s")
            tl["t_s"].append(env.now)
            tl["dt_s"].append(dt)
            tl["kv_blocks"].append(sched.pool.used_blocks)
            tl["batch"].append(plan.batch_size)
            tl["in_flight"].append(sched.in_flight())
            tl["decodes"].append(len(plan.decode_ids))
            tl["prefill_tokens"].append(plan.prefill_tokens)
            tl["waiting"].append(len(sched.waiting))
            yield env.timeout(dt)
            sched.finish_step(plan, env.now)
            if self.check_every_step:
                sched.check_invariants()
            if bar is not None and sched.completed + sched.dropped > bar.n:
                bar.update(sched.completed + sched.dropped - bar.n)
            if self._stop is not None and self._stop(sched, env.now):
                self.stopped = True
                return

    # ---- run ---------------------------------------------------------------------------------------
    def run(self) -> tuple[dict[str, np.ndarray], float]:
        """Simulate to the last completion (or until `stop` says so); return the step timeline and the host
        wall time."""
        start = time.perf_counter()
        bar = None
        if self._progress:
            from tqdm import tqdm
            from hwmodels.cli import progress_disabled
            bar = tqdm(total=self.sched.n_requests, desc=self._progress_desc, unit="req", leave=False,
                       disable=progress_disabled())
        try:
            self.env.process(self._arrivals())
            self.env.run(until=self.env.process(self._engine(bar)))
        finally:
            if bar is not None:
                bar.close()
        self.sched.check_invariants()
        unfinished = self.sched.n_requests - self.sched.completed - self.sched.dropped
        if unfinished and not self.stopped:
            raise AssertionError(f"{unfinished} requests neither completed nor dropped")
        timeline = {k: np.asarray(v) for k, v in self._timeline.items()}
        timeline["kv_blocks"] = timeline["kv_blocks"].astype(np.int64)
        return timeline, time.perf_counter() - start
