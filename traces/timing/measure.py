"""Measuring one point: the wall time of a decode step of the project's stack (from a synthetic state, no
prefill), of a beam-search step of transformers' own generate, or of a prefill; and a point's row after
one more round (statistics over the samples of every round)."""
from __future__ import annotations

import time

import numpy as np

from traces.timing.grid import PolicyPoint, TimingGrid
from traces.timing_format import TimingError, decode_samples, encode_samples


def _reset_peak(device: str) -> None:
    if device.startswith("cuda"):
        import torch
        torch.cuda.reset_peak_memory_stats(device)


def _peak(device: str) -> int:
    """Peak device memory allocated during the point (CUDA); -1 on the CPU, where torch does not track it."""
    if device.startswith("cuda"):
        import torch
        return int(torch.cuda.max_memory_allocated(device))
    return -1


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch
        torch.cuda.synchronize()


def make_project_policy(point: PolicyPoint):
    """The keyformer/ policy for a grid point (the project's own slot cache; nothing from HF's cache)."""
    from keyformer import make_policy
    if point.name == "full":
        return make_policy("full")
    return make_policy(point.name, cache_ratio=point.ratio)


def _held_tokens(policy) -> float:
    lengths = policy.kv_lengths()
    return float(np.mean(lengths)) if len(lengths) else 0.0


def _attended_slots(state) -> int:
    """Length of the K/V buffer attention runs over (layer 0; every layer has the same)."""
    cache = getattr(state, "cache", None)
    layers = getattr(cache, "layers", None)
    if layers:
        keys = getattr(layers[0], "keys", None)
        if keys is not None:
            return int(keys.shape[-2])
    return -1


def time_decode(model, point: PolicyPoint, batch: int, context: int, grid: TimingGrid) -> dict:
    """Median wall time of one decode step at (batch, context) under `point`'s policy."""
    import torch
    from keyformer.generate import decode_one_token, synthetic_state

    policy = make_project_policy(point)
    _reset_peak(grid.device)
    # The state keeps the policy applied to the model until it is closed: close it before the next point.
    with torch.inference_mode(), synthetic_state(model, policy, batch, context, seed=grid.seed) as state:
        for _ in range(grid.warmup):
            decode_one_token(state)
        times, cpu_times, held, slots = [], [], [], []
        for _ in range(grid.repeats):
            _sync(grid.device)
            started, cpu_started = time.perf_counter(), time.thread_time()
            decode_one_token(state)
            _sync(grid.device)
            times.append(time.perf_counter() - started)
            cpu_times.append(time.thread_time() - cpu_started)
            held.append(_held_tokens(policy))
            slots.append(_attended_slots(state))
    return _summary(times, cpu_times) | {"kv_tokens": float(np.mean(held)), "slots": int(np.max(slots)),
                                         "peak_mem_bytes": _peak(grid.device)}


def time_hf_decode(model, batch: int, context: int, grid: TimingGrid) -> dict:
    """Median wall time of one beam-search step of transformers' `generate` at (batch, context).

    A stopping criterion notes the clock once per step (after the step's forward and beam selection, before
    the cache reorder), so the time between two consecutive calls is one whole step: reorder, next
    forward over the grown DynamicCache, log-softmax and top-k. The first interval follows the prefill
    and the warm-up intervals are dropped."""
    import torch
    from transformers import StoppingCriteria, StoppingCriteriaList

    class StepClock(StoppingCriteria):
        def __init__(self):
            self.wall, self.cpu = [], []

        def __call__(self, input_ids, scores, **kwargs):
            _sync(grid.device)
            self.wall.append(time.perf_counter())
            self.cpu.append(time.thread_time())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    steps = grid.warmup + grid.repeats + 1
    generator = torch.Generator().manual_seed(grid.seed)
    input_ids = torch.randint(0, model.config.vocab_size, (batch, context), generator=generator).to(grid.device)
    clock = StepClock()
    _reset_peak(grid.device)
    with torch.inference_mode():
        model.generate(input_ids, attention_mask=torch.ones_like(input_ids), num_beams=grid.beams,
                       do_sample=False, max_new_tokens=steps, min_new_tokens=steps, early_stopping=False,
                       length_penalty=1.0, pad_token_id=0, stopping_criteria=StoppingCriteriaList([clock]))
    if len(clock.wall) != steps:
        raise TimingError(f"generate made {len(clock.wall)} steps, expected {steps}")
    times = np.diff(clock.wall)[grid.warmup:]
    cpu_times = np.diff(clock.cpu)[grid.warmup:]
    # interval c (1-based) ends with the forward of the token chosen at call c: context + c keys attended
    attended = context + grid.warmup + (grid.repeats + 1) / 2
    return _summary(list(times), list(cpu_times)) | {"kv_tokens": attended - 1, "slots": int(round(attended)),
                                                     "peak_mem_bytes": _peak(grid.device)}


def time_prefill(model, context: int, grid: TimingGrid) -> dict:
    """Median wall time of a full-attention prefill of `context` tokens at batch 1."""
    import torch
    from keyformer.generate import prefill

    generator = torch.Generator().manual_seed(grid.seed)
    vocab = model.config.vocab_size
    input_ids = torch.randint(0, vocab, (1, context), generator=generator).to(grid.device)
    attention_mask = torch.ones_like(input_ids)
    times, cpu_times = [], []
    _reset_peak(grid.device)
    with torch.inference_mode():
        for i in range(grid.warmup + grid.repeats):
            policy = make_project_policy(PolicyPoint("full", 1.0))
            _sync(grid.device)
            started, cpu_started = time.perf_counter(), time.thread_time()
            with prefill(model, policy, input_ids, attention_mask):
                _sync(grid.device)
                elapsed, cpu_elapsed = time.perf_counter() - started, time.thread_time() - cpu_started
            if i >= grid.warmup:
                times.append(elapsed)
                cpu_times.append(cpu_elapsed)
    return _summary(times, cpu_times) | {"kv_tokens": float(context), "slots": int(context),
                                         "peak_mem_bytes": _peak(grid.device)}


def _summary(times: list[float], cpu_times: list[float]) -> dict:
    """Wall-clock statistics (the measurement) plus the median CPU time of the calling thread: with one
    thread that is the step's own work, so a wall median well above it shows the point was disturbed
    by other processes (the report prints both)."""
    arr = np.asarray(times, dtype=float)
    return {"median_s": float(np.median(arr)), "p10_s": float(np.percentile(arr, 10)),
            "p90_s": float(np.percentile(arr, 90)), "mean_s": float(arr.mean()), "min_s": float(arr.min()),
            "cpu_median_s": float(np.median(cpu_times)),
            "samples_s": [float(t) for t in times], "cpu_samples_s": [float(t) for t in cpu_times]}


def add_round(previous: dict | None, point: dict, result: dict, repeats: int) -> dict:
    """The point's row after one more round: `result` (a time_decode/time_prefill dict, raw samples
    included) appended to the samples of `previous` (None for the first round), statistics recomputed
    over all of them."""
    wall = (decode_samples(previous["samples_s"]) if previous else []) + result["samples_s"]
    cpu = (decode_samples(previous["cpu_samples_s"]) if previous else []) + result["cpu_samples_s"]
    rounds = len(wall) // repeats
    medians = [float(np.median(wall[r * repeats:(r + 1) * repeats])) for r in range(rounds)]
    return point | result | _summary(wall, cpu) | {
        # the policy's bookkeeping is deterministic: kv_tokens is the same every round
        "slots": max(int(result["slots"]), int(previous["slots"]) if previous else -1),
        "peak_mem_bytes": max(int(result["peak_mem_bytes"]), int(previous["peak_mem_bytes"]) if previous else -1),
        "rounds": rounds, "round_medians_s": " ".join(f"{m:.6g}" for m in medians),
        "samples_s": encode_samples(wall), "cpu_samples_s": encode_samples(cpu)}
