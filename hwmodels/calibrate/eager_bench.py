"""The eager_call microbenchmark: host time per top-level torch call in eager model code.

The dispatch benchmark times a bare `torch.add(a, b, out=c)`: the floor of one aten call. Eager model
code pays much more per call than that: a fresh output tensor per op, nested aten calls underneath a
top-level one (linear -> t + addmm/mm, matmul -> expand + bmm + views, ...), nn.Module.__call__
machinery, and the Python between the calls. Decode at batch 1 on a small model is almost nothing
but these costs, so the simulator's eager profiles charge each top-level call this measured time.

What runs: a stack of Llama-like decoder layers built from nn.Modules (RMSNorm, q/k/v/o and a gated
MLP as nn.Linear, rotary embedding with cat, matmul attention over a small fixed K/V, softmax,
residual adds) on one token of width 64, so the arithmetic is negligible and the time is the calls.
The top-level aten calls (profiler events with no parent) are counted once with torch.profiler; the
stack is timed like every other benchmark (bench.median_seconds).

On a CPU (plans with eager_stream_weight_bytes) one model-sized weight is streamed (F.linear over the
next buffer of a pool larger than the last-level cache) before every nn.Linear of the stack, and its
time is excluded: decode interleaves its small ops with weight streaming, which evicts the dispatcher's
own code and data, so a small op right after a 4 MiB GEMV costs about 1.7x what it costs in a tight loop
(measured on the development VM: 10 small muls 27 us hot, 46 us right after an 11.5 MB GEMV).

Series "eager_call", size kind "calls": one point (top-level calls per layer, seconds per layer) with no
streaming (the per-call floor). Series "eager_stream" (streaming plans only), size kind "calls": one point
(streamed weights per layer, seconds per layer with the GEMVs' own time excluded); the fit turns the
difference into a time per weight GEMV, `eager_weight_switch_overhead`. The tensors live on the plan's device: on CUDA the kernels are tiny and
the GPU waits on the host, so the timer measures the host-side cost per call there too.
"""
from __future__ import annotations

import contextlib
import itertools
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

WIDTH, HEADS, KV_TOKENS, LAYERS = 64, 4, 64, 8
STREAM_ATTEMPTS = 3          # measurements of the pair (hot, streaming) until the streaming one is slower
STREAMS_PER_LAYER = 7        # q, k, v, o, gate, up, down: one streamed weight before each
HEAD_DIM = WIDTH // HEADS


class RMSNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(WIDTH))

    def forward(self, x):
        dtype = x.dtype
        x = x.to(torch.float32)           # transformers' norms upcast (a no-op call in fp32, still a call)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.weight * x.to(dtype)


def rotate_half(x):
    return torch.cat((-x[..., HEAD_DIM // 2:], x[..., :HEAD_DIM // 2]), dim=-1)


class WeightStream:
    """Streams the next model-sized weight of a rotating pool (a GEMV, as decode does between its small
    ops) and keeps its own time, which the eager_call sample excludes."""

    def __init__(self, weight_bytes: int, pool_bytes: int, device: str):
        side = int((weight_bytes // 4) ** 0.5)
        pool = torch.empty(pool_bytes // 4, device=device)
        pool.fill_(1.0)                    # touch every page now
        self.weights = itertools.cycle(pool[i * side * side:(i + 1) * side * side].view(side, side)
                                       for i in range(pool.numel() // (side * side)))
        self.x = torch.ones(1, side, device=device)
        self.seconds = 0.0

    def __call__(self) -> None:
        started = time.perf_counter()
        F.linear(self.x, next(self.weights))
        self.seconds += time.perf_counter() - started


def _no_stream() -> None:
    pass


class DecoderLayer(nn.Module):
    """One decode step of a Llama-style layer, written the way eager transformers code is; `stream` runs
    before every projection (the weight streaming of a real model)."""

    def __init__(self, stream=_no_stream):
        super().__init__()
        self.stream = stream
        self.norm1, self.norm2 = RMSNorm(), RMSNorm()
        self.q, self.k, self.v, self.o = (nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(4))
        self.gate = nn.Linear(WIDTH, 2 * WIDTH, bias=False)
        self.up = nn.Linear(WIDTH, 2 * WIDTH, bias=False)
        self.down = nn.Linear(2 * WIDTH, WIDTH, bias=False)
        self.act = nn.SiLU()

    def heads(self, x):
        return x.view(1, 1, HEADS, HEAD_DIM).transpose(1, 2)

    def forward(self, x, cos, sin, keys, values):
        residual, x = x, self.norm1(x)
        self.stream()
        q = self.heads(self.q(x))
        self.stream()
        k = self.heads(self.k(x))
        self.stream()
        self.heads(self.v(x))             # the new V (a real model writes it into the cache)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        scores = torch.matmul(q, keys.transpose(-1, -2)).float().mul_(HEAD_DIM ** -0.5)
        out = torch.matmul(torch.softmax(scores, dim=-1), values).transpose(1, 2).reshape(1, 1, WIDTH)
        self.stream()
        x = residual + self.o(out)
        residual, x = x, self.norm2(x)
        self.stream()
        gate = self.act(self.gate(x))
        self.stream()
        up = self.up(x)
        self.stream()
        return residual + self.down(gate * up)


def make_stack(device: str, stream=_no_stream):
    """forward(): runs the whole stack once on fixed inputs."""
    torch.manual_seed(0)
    layers = nn.ModuleList(DecoderLayer(stream) for _ in range(LAYERS)).to(device)
    new = lambda *shape: torch.randn(*shape, device=device)  # noqa: E731
    x, cos, sin = new(1, 1, WIDTH), new(1, 1, 1, HEAD_DIM), new(1, 1, 1, HEAD_DIM)
    keys, values = new(1, HEADS, KV_TOKENS, HEAD_DIM), new(1, HEADS, KV_TOKENS, HEAD_DIM)

    def forward():
        y = x
        for layer in layers:
            y = layer(y, cos, sin, keys, values)
        return y

    return forward


@contextlib.contextmanager
def _quiet_stderr():
    """Kineto (the profiler's backend) logs profiler_start/stop lines straight to file descriptor 2,
    whatever its log level; they would land in the middle of a progress bar."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def count_top_level_calls(forward) -> int:
    """aten calls that model code makes itself (profiler events without a CPU parent), one forward."""
    forward()   # warm-up outside the profile: first calls may take other paths (lazy init)
    with _quiet_stderr(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        forward()
    return sum(1 for e in prof.events() if e.cpu_parent is None and e.name.startswith("aten::"))


def median_excluding_stream(forward, stream: WeightStream, timer, plan) -> float:
    """Median over plan.repeats forwards of the stack's time minus the streamed GEMVs' own time (one
    forward per sample: with the streaming it lasts tens of milliseconds)."""
    forward()
    forward()
    samples = []
    for _ in range(plan.repeats):
        stream.seconds = 0.0
        samples.append(timer.run(forward, 1) - stream.seconds)
    return statistics.median(samples)


def run_eager_call(plan, timer, new, tick, median_seconds) -> None:
    """Add the eager_call series: one point (top-level calls per layer, seconds per layer)."""
    series = new("eager_call", f"{LAYERS} Llama-like decoder layers of nn.Modules on one token of width {WIDTH} "
                 f"(RMSNorm, q/k/v/o + gated-MLP nn.Linear, rotary with cat, matmul attention over "
                 f"{KV_TOKENS} cached tokens, softmax, residual adds) under torch.inference_mode; size = "
                 "top-level aten calls per layer (torch.profiler), time per layer", "calls")
    with torch.inference_mode():
        calls = count_top_level_calls(make_stack(plan.device))
        hot = median_seconds(make_stack(plan.device), timer, plan)
        if not plan.eager_stream_weight_bytes:
            series.add(calls / LAYERS, hot / LAYERS)
            tick("eager call")
            return
        tick("eager call")
        streamed = new("eager_stream", f"the eager_call stack with a {plan.eager_stream_weight_bytes >> 20} MiB "
                       f"weight streamed (a GEMV over a {plan.eager_stream_pool_bytes >> 20} MiB rotating pool) "
                       "before each of its projections, the GEMVs' own time excluded; size = streamed "
                       "weights per layer, time per layer", "calls")
        stream = WeightStream(plan.eager_stream_weight_bytes, plan.eager_stream_pool_bytes, plan.device)
        seconds = median_excluding_stream(make_stack(plan.device, stream), stream, timer, plan)
        # The fit's switch cost is the difference of the two: a preempted hot sample (a busy machine) can make
        # it non-positive. Re-measure the pair (bounded); fit() bounds what is still non-positive, with a warning.
        for _ in range(STREAM_ATTEMPTS - 1):
            if seconds > hot:
                break
            hot = median_seconds(make_stack(plan.device), timer, plan)
            seconds = median_excluding_stream(make_stack(plan.device, stream), stream, timer, plan)
        del stream
        series.add(calls / LAYERS, hot / LAYERS)
        streamed.add(STREAMS_PER_LAYER, seconds / LAYERS)
        tick("eager call, streaming")
