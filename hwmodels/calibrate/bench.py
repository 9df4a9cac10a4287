"""The microbenchmarks (imports torch: load only after OMP_WAIT_POLICY is set).

CPU and CUDA share every benchmark; they differ only in the Timer (wall clock around a
loop vs CUDA events around it) and in the Plan (sizes, dtypes).
"""
from __future__ import annotations

import itertools
import math
import statistics
import time

import torch
import torch.nn.functional as F

from .eager_bench import run_eager_call
from .fit import Series
from .plan import Plan

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# Every 16-bit half of this 32-bit pattern is 0x3F80 (1.0 in bf16, 1.875 in fp16) and the
# whole word is 1.0019 in fp32: normal numbers in every view, no denormal slow paths.
FILL_PATTERN = 0x3F803F80
MAX_LOOPS = 100_000


class WallTimer:
    """CPU: wall clock around a loop of calls (the ops are synchronous)."""
    name = "time.perf_counter around a loop of calls"

    def sync(self) -> None:
        pass

    def run(self, fn, loops: int) -> float:
        start = time.perf_counter()
        for _ in range(loops):
            fn()
        return time.perf_counter() - start


class CudaEventTimer:
    """CUDA: events recorded around a loop of calls on the current stream."""
    name = "CUDA events around a loop of calls, torch.cuda.synchronize before each sample"

    def sync(self) -> None:
        torch.cuda.synchronize()

    def run(self, fn, loops: int) -> float:
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(loops):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3


def make_timer(device: str):
    return CudaEventTimer() if device == "cuda" else WallTimer()


def median_seconds(fn, timer, plan: Plan) -> float:
    """Median over plan.repeats samples of the time per call; each sample loops the call for
    at least plan.min_sample_s so timer resolution and loop cost do not matter."""
    fn()
    fn()  # warm-up: first calls pay for kernel selection, oneDNN primitive creation, page faults
    timer.sync()
    first = timer.run(fn, 1)
    if plan.long_call_s is not None and first >= plan.long_call_s:
        # A call this long needs no loop (timer resolution is irrelevant) and its samples cost seconds
        # each on a busy machine: the median of 3 single calls (the standard plan's large GEMMs).
        return statistics.median([first, timer.run(fn, 1), timer.run(fn, 1)])
    one = min([first] + [timer.run(fn, 1) for _ in range(2)])  # min: a preempted call must not set the loops
    loops = max(1, min(MAX_LOOPS, math.ceil(plan.min_sample_s / max(one, 1e-7))))
    return statistics.median(timer.run(fn, loops) / loops for _ in range(plan.repeats))


class BufferPool:
    """One allocation carved into equal buffers; calls rotate through them so every call
    reads memory that the previous ones have evicted from cache (when the pool is larger
    than the last-level cache), as decode does when it streams weights layer by layer."""

    def __init__(self, nbytes: int, device: str):
        self.raw = torch.empty(nbytes, dtype=torch.uint8, device=device)
        self.raw.view(torch.int32).fill_(FILL_PATTERN)  # also touches every page now

    def views(self, nbytes: int, dtype: torch.dtype, shape=None) -> list:
        count = len(self.raw) // nbytes
        if count < 1:
            raise ValueError(f"a {nbytes}-byte buffer does not fit in the {len(self.raw)}-byte pool")
        views = [self.raw[i * nbytes:(i + 1) * nbytes].view(dtype) for i in range(count)]
        return [v.view(shape) for v in views] if shape else views


SDPA_QUERY_HEADS, SDPA_KV_HEADS = 16, 4


def run_attention(plan: Plan, pool: BufferPool, head_dim: int, timer, new, tick) -> None:
    """Eager attention's two batched GEMVs over a KV cache of heads `head_dim` wide (keyformer
    attend(): one query row per KV head at decode), K and V rotating through the pool so they
    stream from memory as a long cache does. Series attn_scores_<dtype>_d<d> (q @ K^T) and
    attn_values_<dtype>_d<d> (p @ V); size = bytes of K (or V)."""
    dtype, device, heads = plan.primary_dtype, plan.device, plan.attn_heads
    tdtype = TORCH_DTYPES[dtype]
    element = torch.finfo(tdtype).bits // 8
    scores = new(f"attn_scores_{dtype}_d{head_dim}", f"torch.matmul(q[{heads}, 1, {head_dim}], "
                 f"K[{heads}, S, {head_dim}].transpose(-1, -2)) in {dtype}, K rotating through the pool; "
                 "bytes = size of K", "bytes")
    values = new(f"attn_values_{dtype}_d{head_dim}", f"torch.matmul(p[{heads}, 1, S], V[{heads}, S, "
                 f"{head_dim}]) in {dtype}, V rotating through the pool; bytes = size of V", "bytes")
    q = torch.ones(heads, 1, head_dim, dtype=tdtype, device=device)
    for nbytes in plan.attn_kv_bytes:
        seq = plan.attn_seq_len(nbytes, head_dim)
        size = heads * seq * head_dim * element
        caches = itertools.cycle(pool.views(size, tdtype, (heads, seq, head_dim)))
        p = torch.ones(heads, 1, seq, dtype=tdtype, device=device)
        scores.add(size, median_seconds(lambda: torch.matmul(q, next(caches).transpose(-1, -2)), timer, plan))
        tick(f"attn scores d={head_dim} S={seq}")
        values.add(size, median_seconds(lambda: torch.matmul(p, next(caches)), timer, plan))
        tick(f"attn values d={head_dim} S={seq}")
    # SDPA's decode kernel over a long cache (K and V rotating through the pool, as a decode streams them):
    # its per-(query head, key) cost, which a grouped-query model pays once per query head of a group
    # while it reads each K/V head from memory once (the repeats hit the caches)
    q_heads, kv_heads = SDPA_QUERY_HEADS, SDPA_KV_HEADS
    sdpa = new(f"sdpa_core_{dtype}_d{head_dim}", f"F.scaled_dot_product_attention(q[1, {q_heads}, 1, {head_dim}], "
               f"K[1, {kv_heads}, S, {head_dim}], V, enable_gqa=True) in {dtype}, K and V rotating through the pool; "
               "size = query heads x S", "keys")
    q4 = torch.ones(1, q_heads, 1, head_dim, dtype=tdtype, device=device)
    for nbytes in plan.attn_kv_bytes:
        seq = max(nbytes // (kv_heads * head_dim * element), 1)
        caches = itertools.cycle(pool.views(kv_heads * seq * head_dim * element, tdtype, (1, kv_heads, seq, head_dim)))
        sdpa.add(q_heads * seq, median_seconds(
            lambda: F.scaled_dot_product_attention(q4, next(caches), next(caches), enable_gqa=True), timer, plan))
        tick(f"sdpa d={head_dim} S={seq}")


def fresh_alloc_child(plan: Plan, threads: int) -> list[tuple[int, float, float]]:
    """In a new interpreter (see run_fresh_alloc): (size, seconds per fresh copy, seconds per copy into an
    existing buffer) for every size of the plan."""
    torch.set_num_threads(threads)
    timer = make_timer(plan.device)
    largest = plan.fresh_sizes[-1]
    sources = [torch.empty(largest // 4, device=plan.device).fill_(1.0) for _ in range(2)]
    for nbytes in plan.fresh_sizes * 2:   # allocate and free every size twice: the steady state
        torch.empty(nbytes // 4, device=plan.device).fill_(0)
    out = []
    for nbytes in plan.fresh_sizes:
        srcs = itertools.cycle([src[:nbytes // 4] for src in sources])
        dst = torch.empty(nbytes // 4, device=plan.device).fill_(0)
        fresh = median_seconds(lambda: torch.empty_like(dst).copy_(next(srcs)), timer, plan)
        existing = median_seconds(lambda: dst.copy_(next(srcs)), timer, plan)
        out.append((nbytes, fresh, existing))
    return out


def run_fresh_alloc(plan: Plan, timer, new, tick) -> None:
    """Series fresh_copy (torch.empty_like(dst).copy_(src): the output allocated anew every call, as
    torch.cat, index_select and repeat_kv allocate theirs) and fresh_copy_ref (the same copy into an
    existing buffer), per size n in bytes.

    Measured in a new interpreter (multiprocessing spawn), never in the calling process: whether an
    allocation gets fresh pages depends on the allocator's history (glibc serves a request above its
    mmap threshold from free heap space when a large enough chunk happens to be there, and maps fresh
    pages otherwise), and a caller that has run models (traces.timing --calibrate) leaves large free
    chunks behind that make the copies look free. A clean process is the reproducible state; there,
    every size is allocated and freed twice first, so the adaptive threshold (glibc raises it to the
    largest freed mapping, at most 32 MiB) is in its steady state."""
    import multiprocessing

    fresh = new("fresh_copy", "torch.empty_like(dst).copy_(src) in a new interpreter, the output allocated "
                "anew every call; bytes = 2 x n (read + write)", "bytes")
    ref = new("fresh_copy_ref", "dst.copy_(src) into an existing buffer, the same sizes and process; "
              "bytes = 2 x n", "bytes")
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        results = pool.apply(fresh_alloc_child, (plan, torch.get_num_threads()))
    for nbytes, t_fresh, t_existing in results:
        fresh.add(2 * nbytes, t_fresh)
        tick(f"fresh copy {nbytes >> 20} MiB")
        ref.add(2 * nbytes, t_existing)
        tick(f"copy into existing {nbytes >> 20} MiB")


def run_all(plan: Plan, progress=None, timer=None) -> dict:
    """Run every benchmark of the plan; returns name -> Series. `progress(label)` is called
    after each point; `timer` defaults to the device's own."""
    device = plan.device
    timer = timer or make_timer(device)
    tick = progress or (lambda label: None)
    series: dict[str, Series] = {}

    def new(name, what, kind):
        series[name] = Series(name, what, kind)
        return series[name]

    # Dispatch: one tiny elementwise op (one kernel launch on CUDA).
    a, b, out = (torch.ones(1, device=device) for _ in range(3))
    dispatch = new("dispatch", "torch.add(a, b, out=c) on 1-element fp32 tensors", "calls")
    dispatch.add(1, median_seconds(lambda: torch.add(a, b, out=out), timer, plan))
    tick("dispatch")

    # Host work of one greedy decode-loop step outside the model: pick the token, append it,
    # check for end of sequence (a host sync on CUDA, as generate() does each step).
    logits = torch.randn(1, plan.vocab, device=device)
    ids = torch.ones(1, 1024, dtype=torch.long, device=device)

    def host_step():
        token = torch.argmax(logits, dim=-1)
        torch.cat([ids, token[:, None]], dim=-1)
        return bool((token == 2).all())

    host = new("host_step", f"argmax over {plan.vocab} logits + cat onto 1024 ids + end-of-sequence "
               "check (bool of a device tensor)", "calls")
    host.add(1, median_seconds(host_step, timer, plan))
    tick("host step")

    # Host cost per top-level call of eager model code (eager_bench.py): what eager profiles charge.
    run_eager_call(plan, timer, new, tick, median_seconds)

    pool = BufferPool(plan.pool_bytes, device)
    read = new("read", "torch.sum over fp32 buffers rotating through the pool; bytes = buffer size", "bytes")
    copy = new("copy", "dst.copy_(src) between neighbouring pool buffers; bytes = 2 x buffer size "
               "(read + write)", "bytes")
    for nbytes in plan.stream_sizes:
        buffers = itertools.cycle(pool.views(nbytes, torch.float32))
        read.add(nbytes, median_seconds(lambda: torch.sum(next(buffers)), timer, plan))
        tick(f"read {nbytes >> 10} KiB")
        views = pool.views(nbytes, torch.float32)
        if len(views) >= 2:
            pairs = itertools.cycle(list(zip(views, views[1:] + views[:1])))

            def copy_next():
                dst, src = next(pairs)
                dst.copy_(src)

            copy.add(2 * nbytes, median_seconds(copy_next, timer, plan))
            tick(f"copy {nbytes >> 10} KiB")
    for dtype in plan.gemv_dtypes:
        gemv = new(f"gemv_{dtype}", f"F.linear(x[1, n], W[n, n]) in {dtype}, W rotating through the "
                   "pool; bytes = n*n*element size", "bytes")
        tdtype, element = TORCH_DTYPES[dtype], torch.finfo(TORCH_DTYPES[dtype]).bits // 8
        for nbytes in plan.stream_sizes:
            n = plan.gemv_shape(nbytes, dtype)
            weights = itertools.cycle(pool.views(n * n * element, tdtype, (n, n)))
            x = torch.ones(1, n, dtype=tdtype, device=device)
            gemv.add(n * n * element, median_seconds(lambda: F.linear(x, next(weights)), timer, plan))
            tick(f"gemv {dtype} n={n}")
    dtype = plan.primary_dtype
    tdtype, element = TORCH_DTYPES[dtype], torch.finfo(TORCH_DTYPES[dtype]).bits // 8
    for n in plan.skinny_sides:
        skinny = new(f"skinny_{dtype}_n{n}", f"F.linear(x[M, {n}], W[{n}, {n}]) in {dtype}, W rotating "
                     f"through the pool; size = token rows M; FLOPs = 2 M {n}^2", "rows")
        weights = itertools.cycle(pool.views(n * n * element, tdtype, (n, n)))
        for rows in plan.skinny_rows:
            x = torch.ones(rows, n, dtype=tdtype, device=device)
            skinny.add(rows, median_seconds(lambda: F.linear(x, next(weights)), timer, plan))
            tick(f"skinny {dtype} n={n} M={rows}")
        # the same weights read as [in, out] (x @ W plus a bias, as transformers' Conv1D does)
        in_out = new(f"skinny_io_{dtype}_n{n}", f"torch.addmm(b[{n}], x[M, {n}], W[{n}, {n}]) in {dtype} (weights "
                     f"stored [in, out], as transformers' Conv1D), W rotating through the pool; size = token rows "
                     f"M; FLOPs = 2 M {n}^2", "rows")
        bias = torch.zeros(n, dtype=tdtype, device=device)
        for rows in plan.skinny_rows:
            x = torch.ones(rows, n, dtype=tdtype, device=device)
            in_out.add(rows, median_seconds(lambda: torch.addmm(bias, x, next(weights)), timer, plan))
            tick(f"skinny [in, out] {dtype} n={n} M={rows}")
    for d in plan.attn_head_dims:
        run_attention(plan, pool, d, timer, new, tick)
    if plan.fresh_sizes:
        run_fresh_alloc(plan, timer, new, tick)
    del pool
    for dtype, sizes in plan.gemm_sizes.items():
        gemm = new(f"gemm_{dtype}", f"F.linear(A[n, n], B[n, n]) in {dtype}; FLOPs = 2 n^3", "flops")
        for n in sizes:
            x = torch.randn(n, n, device=device).to(TORCH_DTYPES[dtype])
            w = torch.randn(n, n, device=device).to(TORCH_DTYPES[dtype])
            gemm.add(2 * n**3, median_seconds(lambda: F.linear(x, w), timer, plan))
            tick(f"gemm {dtype} n={n}")
    if not copy.points:
        del series["copy"]
    return series
