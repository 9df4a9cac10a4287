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

from .columns import StepColumns
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
                 stop: Callable[[Scheduler, float], bool] | None = None,
                 after_step: Callable[[Scheduler], None] | None = None):
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
        self._after_step = after_step
        # one row per step in numpy columns (no Python objects per step: a million-request run has a
        # million steps); simpy's clock starts at the int 0, kept as an int column while every t is one
        self._timeline = StepColumns({"t_s": np.float64, "dt_s": np.float64, **dict.fromkeys(
            ("kv_blocks", "batch", "in_flight", "decodes", "prefill_tokens", "waiting"), np.int64)})
        self._int_clock = True

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
            self._int_clock = self._int_clock and isinstance(env.now, int)
            tl.append(env.now, dt, sched.pool.used_blocks, plan.batch_size, sched.in_flight(), len(plan.decode_ids),
                      plan.prefill_tokens, len(sched.waiting))
            yield env.timeout(dt)
            sched.finish_step(plan, env.now)
            if self._after_step is not None:
                self._after_step(sched)
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
        timeline = self._timeline.arrays()
        if not self._timeline.n:      # no step ran (every request dropped): float columns, as ever
            timeline = {k: v.astype(np.int64 if k == "kv_blocks" else float) for k, v in timeline.items()}
        elif self._int_clock:
            timeline["t_s"] = timeline["t_s"].astype(np.int64)
        return timeline, time.perf_counter() - start
