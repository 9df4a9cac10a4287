"""Discrete-event (simpy) simulation of one accelerator serving a stream of requests.

arrivals (workloads) -> scheduler (vLLM-like continuous batching, KV-memory admission, preemption)
-> server (simpy processes; each step timed by sim.engine) -> metrics (vLLM benchmark_serving).
Modules: arrivals, kvmemory (block pool, per-request KV schedules), step_plan (SchedulerConfig, StepPlan),
scheduler, server, metrics, analytic (the step timer on sim.engine), serving (ServeConfig, run_config,
simulate) and cli (`python -m sim.serve`, whose module sim/serve.py is a thin entry re-exporting these).
"""
from .arrivals import Workload, load_workload, make_workload, synthetic_workload
from .kvmemory import BlockPool
from .metrics import ServeResult, summarize
from .scheduler import ADMISSION_MODES, Scheduler, SchedulerConfig, StepPlan
from .server import ServingSimulation, StepTimer

__all__ = ["ADMISSION_MODES", "BlockPool", "Scheduler", "SchedulerConfig", "ServeResult", "ServingSimulation",
           "StepPlan", "StepTimer", "Workload", "load_workload", "make_workload", "summarize",
           "synthetic_workload"]
