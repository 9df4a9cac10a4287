"""`Device`: one piece of hardware as the simulator sees it (values in base units).

The contract the simulator relies on (sim.engine, sim.opcost; a test double provides the same):
    name, memory_bytes, memory_bw, launch_overhead_s, host_overhead_s     figures (bytes, bytes/s, s)
    peak_flops(dtype)                     dense peak FLOP/s of a dtype
    bw_efficiency(nbytes)                 fraction of memory_bw reached by transfers of nbytes
    compute_efficiency(flops)             fraction of peak reached by kernels of `flops` FLOPs
    compute_equivalent_flops(flops, peak) the curve's size axis for a kernel at `peak` (identity: as given)
    tables                                the optional calibrated tables, one `CalibratedTables`;
                                          NEUTRAL (every one absent) for a datasheet file
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

import numpy as np

from .dtypes import canonical_dtype

# peak_flops(dtype) for a dtype the file does not list: the nearest *wider* format the
# device has (its kernels would run in that format), e.g. int4 -> int8 and fp8 -> bf16 on
# an A100, which has no fp8 units. fp32 has nothing wider, so a device without an fp32
# figure (a TPU) uses its 16-bit matrix rate, an optimistic bound.
FALLBACK = {
    "fp32": ("bf16", "fp16"),
    "bf16": ("fp16", "fp32"),
    "fp16": ("bf16", "fp32"),
    "fp8": ("bf16", "fp16", "fp32"),
    "int8": ("bf16", "fp16", "fp32"),
    "int4": ("int8", "fp8", "bf16", "fp16", "fp32"),
}


# glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit systems: its adaptive mmap threshold never exceeds 32 MiB, so
# a larger allocation is always mapped to fresh pages (malloc/malloc.c, mallopt(3))
MMAP_THRESHOLD_MAX = 32 * 2**20


@dataclass(frozen=True)
class CalibratedTables:
    """The optional tables and figures a calibrated device file adds (hwmodels.calibrate), with neutral
    defaults: absent (None), each leaves the roofline as it is. Weight GEMMs then have no skinny-GEMM
    limit (a streaming kernel may run them instead), attention's GEMVs over the KV cache and copies into
    fresh tensors stream like any op (factor 1), and eager code pays launch_overhead_s per call."""
    # token rows of a weight GEMM -> fraction of peak FLOP/s (the measured skinny-GEMM rate)
    gemm_rows_curve: object = None
    # the same for weights stored [in, out] and applied as x @ W (transformers' Conv1D: GPT-2), which a
    # CPU BLAS runs with other micro-kernels; None: such GEMMs use gemm_rows_curve
    gemm_rows_in_out_curve: object = None
    # head width -> fraction of the streaming rate that eager attention's batched GEMVs over the KV cache
    # reach: q @ K^T (scores) and p @ V (values)
    attn_scores_curve: object = None
    attn_values_curve: object = None
    # per top-level call of eager model code (nn.Module machinery, output allocation, nested aten calls,
    # Python between calls): what eager profiles charge per launch
    eager_call_overhead_s: float | None = None
    # what the eager calls around one streamed weight GEMV lose (their code and data were evicted by the
    # stream): eager profiles charge it per weight-GEMM launch
    eager_weight_switch_s: float | None = None
    # bytes of a newly allocated tensor -> fraction of the copy rate into an existing buffer that filling
    # it reaches (a CPU allocator maps fresh pages above its mmap threshold)
    fresh_alloc_curve: object = None
    # head width -> fraction of the fp32 peak that SDPA's decode kernel reaches per (query head, key), K/V
    # in cache (hwmodels.calibrate sdpa_core series); None: SDPA costs its bytes like any attention
    sdpa_decode_curve: object = None

    def gemm_rows_efficiency(self, rows, in_out: bool = False):
        """Achievable fraction of peak FLOP/s of a weight GEMM with `rows` token rows (array in,
        array out), or None without a `gemm_rows_efficiency` table. `in_out`: weights stored [in, out]
        (x @ W), read off `gemm_rows_in_out_efficiency` where the file has it.

        Few-row GEMMs (decode at batch 2..64) do not reach the square-GEMM rate: a CPU BLAS runs
        them with narrow micro-kernels that are neither streaming (GEMV) nor register-blocked
        (GEMM). The table is measured on model-sized weights (hwmodels.calibrate, skinny series)."""
        if self.gemm_rows_curve is None:
            return None
        if in_out and self.gemm_rows_in_out_curve is not None:
            return self.gemm_rows_in_out_curve(rows)
        return self.gemm_rows_curve(rows)

    def attn_scores_factor(self, head_dim):
        """Fraction of the streaming rate (memory_bw x bw_efficiency) that q @ K^T over a KV cache
        of heads `head_dim` wide reaches (interpolated over head width, held beyond the table's
        ends); 1.0 without an `attn_scores_efficiency` table.

        Eager attention multiplies one query row per KV head by K^T: a batched GEMV whose inner
        loop is only head_dim long, which on a CPU streams K slower than a weight GEMV streams W."""
        return _factor(self.attn_scores_curve, head_dim)

    def attn_values_factor(self, head_dim):
        """The same as attn_scores_factor for p @ V (`attn_values_efficiency`)."""
        return _factor(self.attn_values_curve, head_dim)

    def fresh_alloc_factor(self, nbytes):
        """Fraction of its streaming rate that a copy into a newly allocated tensor of `nbytes` bytes
        reaches (array in, array out; at most 1); 1.0 without a `fresh_alloc_efficiency` table.

        Eager code that grows or reorders a cache (torch.cat, index_select, repeat_kv) allocates its
        output every call. glibc serves allocations above its mmap threshold (at most 32 MiB) with
        fresh pages that fault and are zeroed on first write; a GPU caching allocator reuses blocks.
        (The table's fractions are in (0, 1]: the schema checks them.)

        Two regimes, split at glibc's largest mmap threshold (MMAP_THRESHOLD_MAX): a tensor is read off
        the measured sizes on its own side of it (interpolated in log-size, held at that side's ends),
        never blended across it. Interpolating between the last heap size and the first mapped one (32
        and 48 MiB in the CPU plan) gave a 37 MB tensor, which glibc maps to fresh pages, a mix of the
        two (measured 2026-12-01: GPT-2 small at batch 4 and 3000 tokens, 37 MB per layer's K, was
        predicted 46% fast that way)."""
        curve = self.fresh_alloc_curve
        sizes = None if curve is None else np.asarray(curve.sizes, dtype=float)
        if sizes is None or (sizes <= MMAP_THRESHOLD_MAX).all() or (sizes > MMAP_THRESHOLD_MAX).all():
            return _factor(curve, nbytes)     # no table, or all its sizes on one side: the curve as it is
        fractions = np.log(np.asarray(curve.fractions, dtype=float))
        x = np.log(np.maximum(np.asarray(nbytes, dtype=float), 1.0))
        heap, mapped = sizes <= MMAP_THRESHOLD_MAX, sizes > MMAP_THRESHOLD_MAX
        below = np.interp(x, np.log(sizes[heap]), fractions[heap])
        above = np.interp(x, np.log(sizes[mapped]), fractions[mapped])
        value = np.exp(np.where(np.asarray(nbytes, dtype=float) > MMAP_THRESHOLD_MAX, above, below))
        return float(value) if np.ndim(value) == 0 else value

    def sdpa_decode_efficiency(self, head_dim):
        """Fraction of the fp32 peak that scaled_dot_product_attention reaches at decode per (query head,
        key) for heads `head_dim` wide (nearest measured widths interpolated, held beyond the ends), or
        None without an `sdpa_decode_efficiency` table. On a CPU its kernel loops over query heads, so a
        grouped-query model pays this per query head while reading each K/V head from memory once."""
        if self.sdpa_decode_curve is None:
            return None
        return _factor(self.sdpa_decode_curve, head_dim)


NEUTRAL = CalibratedTables()
# The curve tables of a calibrated file: (file key, CalibratedTables attribute), in the order `hwmodels show`
# lists them; the schema reads them, to_dict writes them, the CLI shows them from this one declaration.
CURVE_TABLES = (("gemm_rows_efficiency", "gemm_rows_curve"), ("gemm_rows_in_out_efficiency", "gemm_rows_in_out_curve"),
                ("attn_scores_efficiency", "attn_scores_curve"), ("attn_values_efficiency", "attn_values_curve"),
                ("sdpa_decode_efficiency", "sdpa_decode_curve"), ("fresh_alloc_efficiency", "fresh_alloc_curve"))
TABLE_FIELDS = tuple(CalibratedTables.__dataclass_fields__)


@dataclass(frozen=True, eq=False)
class Device:
    """Peak figures, size-dependent achievable fractions and overheads of one device.

    Two devices are equal when their files have the same content (`content_hash`), so a
    Device can key a result cache.
    """
    name: str
    description: str
    memory_bytes: float                  # bytes
    memory_bw: float                     # bytes/s, peak
    flops: Mapping[str, float]           # dense peak FLOP/s per dtype listed in the file
    bw_curve: object                     # size in bytes -> fraction of memory_bw
    compute_curve: object                # kernel FLOPs -> fraction of peak FLOP/s
    launch_overhead_s: float             # per kernel
    host_overhead_s: float               # per step
    content_hash: str
    source_path: str
    sources: Mapping[str, str] = field(default_factory=dict)   # field -> provenance
    notes: str | None = None
    calibration: Mapping | None = None   # raw measurements of a calibrated file
    # dtype whose peak the compute curve's sizes refer to (None: sizes are used as given)
    compute_reference_dtype: str | None = None
    # the optional calibrated tables and figures (hwmodels.calibrate); NEUTRAL for a datasheet file
    tables: CalibratedTables = field(default=NEUTRAL, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "flops", MappingProxyType(dict(self.flops)))
        object.__setattr__(self, "sources", MappingProxyType(dict(self.sources)))

    def __eq__(self, other):
        return isinstance(other, Device) and other.content_hash == self.content_hash

    def __hash__(self):
        return hash(self.content_hash)

    def flops_dtype(self, dtype: str) -> str:
        """The dtype whose rate `peak_flops(dtype)` uses (itself, or its fallback)."""
        dtype = canonical_dtype(dtype)
        if dtype in self.flops:
            return dtype
        for candidate in FALLBACK[dtype]:
            if candidate in self.flops:
                return candidate
        raise ValueError(f"device {self.name} lists no FLOP/s figure usable for {dtype}")

    def peak_flops(self, dtype: str) -> float:
        """Dense peak FLOP/s for `dtype`, falling back per FALLBACK when the file lacks it."""
        return self.flops[self.flops_dtype(dtype)]

    def bw_efficiency(self, nbytes):
        """Achievable fraction of `memory_bw` for transfers of `nbytes` (array in, array out)."""
        return self.bw_curve(nbytes)

    @property
    def compute_reference_peak(self) -> float | None:
        """Peak FLOP/s of `compute_reference_dtype` (None when the file names none)."""
        if self.compute_reference_dtype is None:
            return None
        return self.peak_flops(self.compute_reference_dtype)

    def compute_equivalent_flops(self, flops, peak):
        """`flops` of a kernel running at `peak` FLOP/s, mapped onto the curve's size axis.

        The ramp of a compute curve is a time (under-filled waves, tail, pipeline fill): a
        kernel reaches the same fraction of its own dtype's peak when it has the same
        time-at-peak, flops / peak. So the curve is read at flops x reference_peak / peak.
        Without a reference dtype the sizes are used as given."""
        ref = self.compute_reference_peak
        if ref is None:
            return flops
        return np.asarray(flops, dtype=np.float64) * (ref / np.asarray(peak, dtype=np.float64))

    def compute_efficiency(self, flops, dtype: str | None = None):
        """Achievable fraction of peak FLOP/s for kernels of `flops` FLOPs (array in, array out).

        With `dtype`, the kernel runs at `peak_flops(dtype)` and the curve is evaluated at the
        same time-at-peak (see compute_equivalent_flops); without it, at `flops` as given."""
        if dtype is None:
            return self.compute_curve(flops)
        return self.compute_curve(self.compute_equivalent_flops(flops, self.peak_flops(dtype)))

    # the calibrated tables' lookups, on the device as before (the simulator reads them through `tables`)
    def gemm_rows_efficiency(self, rows, in_out: bool = False):
        return self.tables.gemm_rows_efficiency(rows, in_out)

    def attn_scores_factor(self, head_dim):
        return self.tables.attn_scores_factor(head_dim)

    def attn_values_factor(self, head_dim):
        return self.tables.attn_values_factor(head_dim)

    def fresh_alloc_factor(self, nbytes):
        return self.tables.fresh_alloc_factor(nbytes)

    def to_dict(self) -> dict:
        """JSON-ready summary in base units (bytes, bytes/s, FLOP/s, seconds)."""
        return {
            "name": self.name,
            "description": self.description,
            "memory_bytes": self.memory_bytes,
            "memory_bw": self.memory_bw,
            "peak_flops": dict(self.flops),
            "bw_efficiency": self.bw_curve.to_dict(),
            "compute_efficiency": self.compute_curve.to_dict(),
            "compute_reference_dtype": self.compute_reference_dtype,
            **{key: None if getattr(self.tables, attr) is None else getattr(self.tables, attr).to_dict()
               for key, attr in CURVE_TABLES},
            "launch_overhead_s": self.launch_overhead_s,
            "host_overhead_s": self.host_overhead_s,
            "eager_call_overhead_s": self.tables.eager_call_overhead_s,
            "eager_weight_switch_s": self.tables.eager_weight_switch_s,
            "content_hash": self.content_hash,
            "source_path": self.source_path,
            "sources": dict(self.sources),
            "notes": self.notes,
        }


def _factor(curve, key):
    """curve(key) (a head width, a tensor size) as a float for a scalar (array for an array); 1.0
    without a curve."""
    if curve is None:
        return 1.0 if np.ndim(key) == 0 else np.ones(np.shape(key))
    value = curve(key)
    return float(value) if np.ndim(value) == 0 else value
