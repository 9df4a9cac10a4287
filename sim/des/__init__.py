"""Discrete-event (simpy) simulation of one accelerator serving a stream of requests.

arrivals (workloads) -> scheduler (vLLM-like continuous batching, KV-memory admission, preemption)
-> server (simpy processes; each step timed by sim.engine) -> metrics (vLLM benchmark_serving).
The user-facing entry is `sim.serve.simulate` / `python -m sim.serve`.
"""
from .arrivals import Workload, load_workload, make_workload, synthetic_workload
from .kvmemory import BlockPool
from .metrics import ServeResult, summarize
from .scheduler import ADMISSION_MODES, Scheduler, SchedulerConfig, StepPlan
from .server import ServingSimulation, StepTimer

__all__ = ["ADMISSION_MODES", "BlockPool", "Scheduler", "SchedulerConfig", "ServeResult", "ServingSimulation",
           "StepPlan", "StepTimer", "Workload", "load_workload", "make_workload", "summarize",
           "synthetic_workload"]
