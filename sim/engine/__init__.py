"""The analytic roofline engine: operator tables -> step times -> request latency, memory and capacity.

Pure numpy. `evaluate(...)` takes arrays of design points (batch, beams, prompt, gen, cache ratio,
recent ratio, dtypes) for one (device, model, policy, profile) and returns arrays of results; `predict`
is that same path for one point plus the operator tables. Time per kernel (an operator plus those that
run inside it) is
    max(compute seconds, bytes / (bw * bw_eff(bytes))) + launches * launch_overhead
where only GEMM-class operators pay the compute-efficiency ramp (sim.opcost has the one rule; eager
profiles: launches * eager_call_overhead where the hardware file has it) and a step adds the device's
host overhead. docs/sim.md has the formulas and assumptions.

Modules, in the order a prediction flows through them: `setup` (names and dtypes resolved once per
device, model, policy, dtypes and profile), `timing` (an operator list's seconds: `kernel_seconds`, the one
formula both the vectorised `time_ops` and the DES's `step_time_scalar` use), `steps` (the DES's step
entries), `latency` (TTFT/TPOT/e2e over many points), `memory` (memory and max batch by name),
`evaluation` (`evaluate`), `prediction` (`predict`, `Prediction`, the operator tables). Every public name
is importable from `sim.engine` itself.

Array layout inside: (points, decode-step nodes, layer slots). Layer slots is 1 (all layers alike,
each op counted n_layers times) or n_layers (a trace's per-layer KV lengths via `kv_override`).
"""
from __future__ import annotations

from sim.engine.evaluation import evaluate
from sim.engine.latency import DECODE_NODES, decode_nodes
from sim.engine.memory import MAX_BATCH_LIMIT, max_batch, max_batch_all_at_once, memory_bytes
from sim.engine.prediction import TABLE_COLUMNS, Prediction, predict
from sim.engine.setup import (DtypeCodes, Setup, activation_dtype, launch_seconds, make_ctx, make_setup, resolve_device,
                              switch_seconds)
from sim.engine.steps import decode_step_time, mixed_step_time, packed_prefill_time, prefill_time
from sim.engine.timing import TimedOps, kernel_seconds, step_time_scalar, stream_factors, streams_weights, time_ops
from sim.ops import dense_ops, forward_ops, group_ops

__all__ = ["DECODE_NODES", "DtypeCodes", "MAX_BATCH_LIMIT", "TABLE_COLUMNS", "Prediction", "Setup", "TimedOps", "activation_dtype",
           "decode_nodes", "decode_step_time", "dense_ops", "evaluate", "forward_ops", "group_ops", "kernel_seconds",
           "launch_seconds", "make_ctx", "make_setup", "max_batch", "max_batch_all_at_once", "memory_bytes",
           "mixed_step_time", "packed_prefill_time", "predict", "prefill_time", "resolve_device", "step_time_scalar", "stream_factors",
           "streams_weights", "switch_seconds", "time_ops"]
