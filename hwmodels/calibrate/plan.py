"""What a calibration measures: sizes, dtypes and repeats per device kind and mode.

The only device-specific inputs besides the timer. Pure data, no torch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..dtypes import DTYPES, dtype_bytes

KiB, MiB, GiB = 2**10, 2**20, 2**30


@dataclass(frozen=True)
class Plan:
    device: str                       # "cpu" or "cuda"
    mode: str                         # "standard" (CPU default), "full" (--thorough) or "quick"
    stream_sizes: tuple[int, ...]     # bytes per read / per copy source / per GEMV weight
    gemv_dtypes: tuple[str, ...]
    gemm_sizes: dict                  # dtype -> square sizes n (n x n x n GEMMs)
    primary_dtype: str                # dtype whose GEMV/GEMM series shape the curves
    pool_bytes: int                   # rotating buffer pool: reads come from cold memory
    repeats: int                      # samples per point; the median is kept
    min_sample_s: float               # each sample loops the op at least this long
    vocab: int = 32000                # logits row of the decode-loop host-work benchmark
    # skinny GEMMs F.linear(x[M, n], W[n, n]) in the primary dtype, W rotating through the pool:
    # model-sized square weights n x n and token-row counts M (decode at batch M); each size is also
    # measured in the [in, out] layout, torch.addmm(b, x, W) (transformers' Conv1D: GPT-2), which the
    # BLAS runs with other micro-kernels (at 4-8 rows about 0.7x the F.linear time on the dev VM)
    skinny_sides: tuple[int, ...] = ()
    skinny_rows: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    # eager attention's batched GEMVs over a KV cache in the primary dtype: q[H, 1, d] @ K[H, S, d]^T
    # and p[H, 1, S] @ V[H, S, d], K/V rotating through the pool; per head width d, one point per
    # K size in attn_kv_bytes (S = bytes / (H d element size))
    attn_head_dims: tuple[int, ...] = ()
    attn_kv_bytes: tuple[int, ...] = (4 * MiB, 16 * MiB, 64 * MiB)
    attn_heads: int = 16
    # eager_call on a CPU: stream one weight of this many bytes (rotating through eager_stream_pool_bytes)
    # before every nn.Linear of the stack, as decode streams its weights between the small ops; 0: no
    # streaming (the stack's own tiny state then stays in L1/L2, an optimistic per-call time)
    eager_stream_weight_bytes: int = 0
    eager_stream_pool_bytes: int = 0
    # copies into a newly allocated tensor vs into an existing buffer, per tensor size (bytes): eager
    # cache code (torch.cat, index_select, repeat_kv) allocates its output every call
    fresh_sizes: tuple[int, ...] = ()
    # a call at least this long (seconds) is timed without a loop, 3 samples instead of `repeats` (None:
    # always `repeats`): the large GEMMs on a busy CPU, where each call takes seconds
    long_call_s: float | None = None

    def __post_init__(self):
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device must be cpu or cuda, got {self.device!r}")
        if self.mode not in ("standard", "full", "quick"):
            raise ValueError(f"mode must be standard, full or quick, got {self.mode!r}")
        sizes = self.stream_sizes
        if not sizes or any(s <= 0 for s in sizes) or list(sizes) != sorted(set(sizes)):
            raise ValueError("stream sizes must be positive and strictly increasing")
        if max(sizes) > self.pool_bytes:
            raise ValueError("the largest stream size must fit in the buffer pool")
        for dtype in (*self.gemv_dtypes, *self.gemm_sizes):
            if dtype not in DTYPES:
                raise ValueError(f"unknown dtype {dtype!r}")
        if self.primary_dtype not in self.gemv_dtypes or self.primary_dtype not in self.gemm_sizes:
            raise ValueError("the primary dtype must have GEMV and GEMM series")
        for dtype, ns in self.gemm_sizes.items():
            if not ns or list(ns) != sorted(set(ns)) or ns[0] <= 0:
                raise ValueError(f"GEMM sizes for {dtype} must be positive and increasing")
        if any(n <= 0 for n in self.skinny_sides) or list(self.skinny_rows) != sorted(set(self.skinny_rows)) \
                or (self.skinny_rows and self.skinny_rows[0] <= 0):
            raise ValueError("skinny GEMM sides and rows must be positive (rows strictly increasing)")
        if any(d <= 0 for d in self.attn_head_dims) or list(self.attn_head_dims) != sorted(set(self.attn_head_dims)) \
                or self.attn_heads <= 0:
            raise ValueError("attention head widths must be positive and strictly increasing, heads positive")
        if self.attn_head_dims:
            kv = self.attn_kv_bytes
            if not kv or list(kv) != sorted(set(kv)) or kv[0] <= 0 or 2 * kv[-1] > self.pool_bytes:
                raise ValueError("attention K/V sizes must be positive, strictly increasing, and two of "
                                 "the largest must fit in the buffer pool")
            for d in self.attn_head_dims:
                self.attn_seq_len(kv[0], d)   # raises when a size holds no whole token
        if self.eager_stream_weight_bytes < 0 or (self.eager_stream_weight_bytes
                                                   and self.eager_stream_pool_bytes < 2 * self.eager_stream_weight_bytes):
            raise ValueError("the eager-call weight stream needs a pool of at least two weights")
        if any(f <= 0 for f in self.fresh_sizes) or list(self.fresh_sizes) != sorted(set(self.fresh_sizes)) \
                or (self.fresh_sizes and 2 * self.fresh_sizes[-1] > self.pool_bytes):
            raise ValueError("fresh-allocation sizes must be positive, strictly increasing, and two of the "
                             "largest must fit in the buffer pool")
        if self.repeats < 3:
            raise ValueError("at least 3 repeats are needed for a meaningful median")
        if self.min_sample_s <= 0:
            raise ValueError("the minimum sample time must be positive")
        if self.long_call_s is not None and self.long_call_s < self.min_sample_s:
            raise ValueError("long_call_s must be at least the minimum sample time")

    def gemv_shape(self, nbytes: int, dtype: str) -> int:
        """Side n of the largest square GEMV weight (n x n) in `dtype` within `nbytes` bytes."""
        n = math.isqrt(int(nbytes // dtype_bytes(dtype)))
        if n < 16:
            raise ValueError(f"{nbytes} bytes is too small for a {dtype} GEMV benchmark")
        return n

    def attn_seq_len(self, nbytes: int, head_dim: int) -> int:
        """Cached tokens S of a K (or V) of `nbytes` bytes: attn_heads x S x head_dim elements."""
        seq = int(nbytes // (self.attn_heads * head_dim * dtype_bytes(self.primary_dtype)))
        if seq < 1:
            raise ValueError(f"{nbytes} bytes is too small for a K of {self.attn_heads} heads x {head_dim}")
        return seq

    def n_points(self) -> int:
        """Benchmark points, for the progress bar (dispatch, host step and eager call: 3, plus the
        streaming eager call where the plan streams)."""
        copies = sum(1 for s in self.stream_sizes if 2 * s <= self.pool_bytes)
        return (3 + bool(self.eager_stream_weight_bytes) + len(self.stream_sizes) + copies + len(self.stream_sizes) * len(self.gemv_dtypes)
                + sum(len(ns) for ns in self.gemm_sizes.values())
                + 2 * len(self.skinny_sides) * len(self.skinny_rows)
                + 3 * len(self.attn_head_dims) * len(self.attn_kv_bytes) + 2 * len(self.fresh_sizes))


def _powers(start: int, stop: int, factor: int = 4) -> tuple[int, ...]:
    sizes, s = [], start
    while s <= stop:
        sizes.append(s)
        s *= factor
    return tuple(sizes)


def make_plan(device: str, quick: bool, thorough: bool = True) -> Plan:
    """The plan for `device`: quick (tests), else the full plan when `thorough` (every size; the committed
    calibrations and traces.timing --calibrate use it), else on a CPU the standard plan (the CLI's default:
    the full plan without its slowest points, about 4x faster). A GPU has one non-quick plan."""
    if device == "cpu" and quick:
        # Seconds, for tests: warm caches (the pool fits in the LLC), few sizes; not representative.
        return Plan("cpu", "quick", _powers(64 * KiB, 4 * MiB), ("fp32",), {"fp32": (32, 64, 128, 256)},
                    "fp32", pool_bytes=16 * MiB, repeats=3, min_sample_s=0.5e-3,
                    skinny_sides=(256,), skinny_rows=(1, 2, 4, 8),
                    attn_head_dims=(64,), attn_kv_bytes=(256 * KiB, 1 * MiB), fresh_sizes=(1 * MiB, 4 * MiB))
    if device == "cpu" and not thorough:
        # The full plan below without what costs most and changes least on a 2-core machine (about 80% of
        # its time there): the 1 GiB stream point (reads still come from the 1 GiB pool, > the LLC: cold),
        # the 2048^3 and 4096^3 bf16 and the 2048^3 fp16 GEMMs (bf16/fp16 peaks then come from 1024^3; the
        # primary fp32 keeps 2048^3), 7 repeats instead of 11, and 3 unlooped samples for calls of 0.2 s or
        # more (a 2048^3 GEMM takes seconds per call when other jobs hold the cores). About 20 s on a quiet
        # 2-core VM; --thorough for the full plan.
        full = make_plan("cpu", False, thorough=True)
        return replace(full, mode="standard", stream_sizes=_powers(64 * KiB, 256 * MiB), repeats=7,
                       gemm_sizes={"fp32": (64, 128, 256, 512, 1024, 2048),
                                   "bf16": (64, 128, 256, 512, 1024), "fp16": (256, 1024)}, long_call_s=0.2)
    if device == "cpu":
        # 64 KiB .. 1 GiB in x4 steps. The 1 GiB pool is > 3x the last-level cache of this
        # class of server CPU (300 MiB here), so every read streams from DRAM as decode
        # weights do. bf16 GEMM runs on AMX/AVX512-BF16 where present; fp16 shows the
        # (often slow) fp16 path rather than letting it fall back to the bf16 rate.
        # Many short samples: on a shared machine a preempted OpenMP thread stalls a
        # parallel op for a scheduler tick, and the median of short samples skips those.
        return Plan("cpu", "full", _powers(64 * KiB, GiB), ("fp32", "bf16"),
                    {"fp32": (64, 128, 256, 512, 1024, 2048), "bf16": (64, 128, 256, 512, 1024, 2048, 4096),
                     "fp16": (256, 1024, 2048)},
                    "fp32", pool_bytes=GiB, repeats=11, min_sample_s=2e-3,
                    # weights of 4, 16 and 64 MiB (fp32): the projection sizes of 0.1-7B models; rows to 256
                    # so a prefill of a few hundred tokens reads a measured fraction, not the 64-row one
                    skinny_sides=(1024, 2048, 4096), skinny_rows=(1, 2, 4, 8, 16, 32, 64, 128, 256),
                    # K of 4, 16, 64 MiB (fp32): 16 heads x 1024..16384 tokens at d=64; the widths
                    # of small (64) and 7B-class (128) models
                    attn_head_dims=(64, 128),
                    # 4 MiB weights (a 1024 x 1024 projection) from a 512 MiB pool, > the LLC: after each
                    # one the dispatcher's own code and data are cold, as in a real decode step
                    eager_stream_weight_bytes=4 * MiB, eager_stream_pool_bytes=512 * MiB,
                    # per-layer K or V tensors of small to 7B-class models at a few thousand tokens, and both
                    # sides of glibc's largest mmap threshold (32 MiB: a request of it or more is mapped to
                    # fresh pages, one below it reuses the heap), so the table steps where the allocator does
                    fresh_sizes=(4 * MiB, 8 * MiB, 16 * MiB, 24 * MiB, 31 * MiB + 512 * KiB, 32 * MiB, 48 * MiB,
                                 64 * MiB, 128 * MiB))
    if device == "cuda" and quick:
        return Plan("cuda", "quick", _powers(64 * KiB, 64 * MiB), ("bf16",), {"bf16": (256, 1024, 4096)},
                    "bf16", pool_bytes=256 * MiB, repeats=3, min_sample_s=1e-3)
    if device == "cuda":
        # 64 KiB .. 4 GiB; a 4 GiB pool is > 50x the L2 of current GPUs. bf16 GEMMs to 8192^3.
        return Plan("cuda", "full", _powers(64 * KiB, 4 * GiB), ("bf16", "fp32"),
                    {"bf16": (256, 512, 1024, 2048, 4096, 6144, 8192), "fp16": (1024, 4096, 8192),
                     "fp32": (1024, 4096)},
                    "bf16", pool_bytes=4 * GiB, repeats=9, min_sample_s=5e-3,
                    skinny_sides=(4096, 8192), skinny_rows=(1, 2, 4, 8, 16, 32, 64, 128, 256),
                    attn_head_dims=(64, 128), attn_kv_bytes=(16 * MiB, 64 * MiB, 256 * MiB),
                    fresh_sizes=(16 * MiB, 64 * MiB, 256 * MiB, 1 * GiB))
    raise ValueError(f"device must be cpu or cuda, got {device!r}")
