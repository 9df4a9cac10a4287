"""From measured medians to the numbers of a hardware file. Pure numpy, no torch.

The simulator charges an op `max(flops / (peak * ceff(flops)), bytes / (bw * beff(bytes)))
+ launch_overhead`. The fit inverts that model on the microbenchmarks, so the calibrated
file reproduces them:

- launch_overhead = median time of a tiny op (pure dispatch);
- eager_call_overhead (optional) = time per top-level call of eager decoder-layer code (the
  eager_call series: seconds per layer / top-level calls per layer; see eager_bench.py);
- memory_bw = the best streaming read rate measured (read or GEMV series, any size);
- beff(s) = s / (memory_bw * (t(s) - launch)) on the primary-dtype GEMV (the kernel that
  decode runs over the weights), then made non-decreasing (isotonic regression) and
  consistent (no larger transfer predicted faster than a smaller one);
- peak FLOP/s per dtype = the best GEMM rate measured in that dtype; ceff the same way as
  beff on the primary-dtype GEMM series;
- attention tables (fit_attention.py): per head width, the fraction of the beff curve that eager
  attention's GEMVs over a KV cache reach.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..curves import TableCurve
from .fit_attention import fit_attention
# the table helpers, here too for the callers that know them from this module
from .fit_tables import (DECIMALS, SMALLEST_FRACTION, consistent_table, isotonic_increasing,  # noqa: F401
                         raw_efficiency, round_fraction, table_document)

@dataclass
class Series:
    """Medians of one benchmark over sizes: points are (size, seconds per call)."""
    name: str
    what: str                         # how it was measured, for the file
    size_kind: str                    # "bytes" (moved per call), "flops", "calls", "rows" or "keys" (query-head keys)
    points: list = field(default_factory=list)

    def __post_init__(self):
        if self.size_kind not in ("bytes", "flops", "calls", "rows", "keys"):
            raise ValueError(f"size kind must be bytes, flops, calls, rows or keys, got {self.size_kind!r}")

    def add(self, size: float, seconds: float) -> None:
        if not (size > 0 and seconds > 0 and math.isfinite(seconds)):
            raise ValueError(f"{self.name}: size and time must be positive, got {size}, {seconds}")
        self.points.append((float(size), float(seconds)))

    def sizes(self) -> np.ndarray:
        return np.array([p[0] for p in self.points])

    def seconds(self) -> np.ndarray:
        return np.array([p[1] for p in self.points])

    def rates(self) -> np.ndarray:
        """Bytes/s or FLOP/s achieved at each point (dispatch included)."""
        return self.sizes() / self.seconds()

    def best(self) -> tuple[float, float]:
        """(best rate, size where it was reached)."""
        rates = self.rates()
        i = int(np.argmax(rates))
        return float(rates[i]), float(self.sizes()[i])


def human_bytes(nbytes: float) -> str:
    """1073741824 -> '1 GiB'; sizes here are powers of two (or GEMV squares close to them)."""
    for unit, factor in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= factor:
            return f"{nbytes / factor:.4g} {unit}"
    return f"{nbytes:.0f} B"


@dataclass
class FitResult:
    memory_bw: float
    memory_bw_from: str               # e.g. "read at 1.07e9 B"
    bw_table: TableCurve
    flops: dict                       # dtype -> best FLOP/s
    flops_from: dict                  # dtype -> "gemm_bf16 at n=4096"
    compute_table: TableCurve
    launch_overhead_s: float
    host_overhead_s: float
    rows_table: TableCurve | None = None    # token rows -> fraction of peak (skinny GEMM series)
    rows_from: str = ""
    rows_in_out_table: TableCurve | None = None    # the same for weights stored [in, out] (Conv1D)
    rows_in_out_from: str = ""
    attention: dict = field(default_factory=dict)   # "scores"/"values" -> fit_attention.AttnTable
    eager_call_overhead_s: float | None = None       # per top-level eager call (None: not measured)
    eager_switch_s: float | None = None              # per weight GEMV between eager calls (None: not measured)
    fresh_alloc: TableCurve | None = None            # tensor bytes -> copy rate into a fresh tensor / existing
    warnings: tuple[str, ...] = ()                   # values the fit had to bound (printed by the CLI)


def fit(series: dict, primary_dtype: str) -> FitResult:
    """series: name -> Series, with 'dispatch', 'host_step', 'read', 'copy' (optional),
    'gemv_<dtype>' and 'gemm_<dtype>' for at least the primary dtype."""
    for needed in ("dispatch", "host_step", "read", f"gemv_{primary_dtype}", f"gemm_{primary_dtype}"):
        if needed not in series or not series[needed].points:
            raise ValueError(f"calibration is missing the {needed} measurements")
    launch = float(np.median(series["dispatch"].seconds()))
    host = float(np.median(series["host_step"].seconds()))

    # Pure reads only: a copy's writes land in cache and are written back later, so at
    # small sizes its byte count flatters the memory system.
    streaming = [s for name, s in series.items() if name == "read" or name.startswith("gemv_")]
    best = max(((s.best(), s.name) for s in streaming), key=lambda item: item[0][0])
    (memory_bw, at_size), from_name = best
    gemv = series[f"gemv_{primary_dtype}"]
    bw_sizes, bw_fractions = consistent_table(
        gemv.sizes(), raw_efficiency(gemv.sizes(), gemv.seconds(), memory_bw, launch))

    flops, flops_from = {}, {}
    for name, s in series.items():
        if name.startswith("gemm_") and s.points:
            rate, at = s.best()
            dtype = name[len("gemm_"):]
            flops[dtype] = rate
            flops_from[dtype] = f"{name} at n={round((at / 2) ** (1 / 3))} ({at:.3g} FLOP)"
    gemm = series[f"gemm_{primary_dtype}"]
    c_sizes, c_fractions = consistent_table(
        gemm.sizes(), raw_efficiency(gemm.sizes(), gemm.seconds(), flops[primary_dtype], launch))
    rows_table, rows_from = fit_rows(series, primary_dtype, flops[primary_dtype], launch)
    attention = fit_attention(series, primary_dtype, memory_bw, TableCurve(bw_sizes, bw_fractions), launch,
                              peak=flops[primary_dtype])
    switch, warnings = fit_eager_switch(series), []
    if switch is not None and switch < EAGER_SWITCH_FLOOR_S:
        warnings.append(f"eager_weight_switch_overhead came out {switch * 1e6:.3g} us (the streaming eager stack "
                        "was no slower than the hot one: noise or contention); bounded at "
                        f"{EAGER_SWITCH_FLOOR_S * 1e6:g} us, i.e. no measurable switch cost")
        switch = EAGER_SWITCH_FLOOR_S
    in_out_table, in_out_from = fit_rows(series, primary_dtype, flops[primary_dtype], launch, prefix="skinny_io")
    return FitResult(memory_bw, f"{from_name} at {human_bytes(at_size)}", TableCurve(bw_sizes, bw_fractions),
                     flops, flops_from, TableCurve(c_sizes, c_fractions), launch, host, rows_table, rows_from,
                     in_out_table, in_out_from, attention, fit_eager_call(series), switch, fit_fresh_alloc(series),
                     tuple(warnings))


def fit_fresh_alloc(series: dict) -> TableCurve | None:
    """Per tensor size (bytes), the copy time into an existing buffer over the copy time into a newly
    allocated tensor (fresh_copy_ref / fresh_copy), capped at 1 and written down, never up; any shape
    (it drops where the allocator starts mapping fresh pages). None without both series."""
    fresh, ref = series.get("fresh_copy"), series.get("fresh_copy_ref")
    if fresh is None or ref is None or not fresh.points or not ref.points:
        return None
    ref_time = dict(zip(ref.sizes().tolist(), ref.seconds().tolist()))
    pairs = [(size, ref_time[size] / t) for size, t in zip(fresh.sizes().tolist(), fresh.seconds().tolist())
             if size in ref_time and t > 0]
    if not pairs:
        return None
    # the series count read + write (2 x the tensor): the table is keyed by the tensor's own bytes
    return TableCurve(tuple(size / 2 for size, _ in pairs), tuple(round_fraction(f) for _, f in pairs),
                      monotone=False)


def fit_eager_call(series: dict) -> float | None:
    """Seconds per top-level eager call: the median over the eager_call points of seconds per layer /
    calls per layer (one point per run; older calibrations have no such series: None)."""
    eager = series.get("eager_call")
    if eager is None or not eager.points:
        return None
    return float(np.median(eager.seconds() / eager.sizes()))


# A hardware file's eager_weight_switch_overhead must be positive: a difference that comes out at or below
# zero (the streaming stack no slower than the hot one, after bench's re-measurements) is bounded here.
EAGER_SWITCH_FLOOR_S = 1e-9


def fit_eager_switch(series: dict) -> float | None:
    """Seconds per streamed weight that the eager calls around it lose: (the eager_stream stack's time
    per layer - the eager_call stack's) / streamed weights per layer (may be <= 0 on a noisy machine:
    fit() bounds it at EAGER_SWITCH_FLOOR_S with a warning). None without both series (GPU plans and
    older calibrations)."""
    streamed, hot = series.get("eager_stream"), series.get("eager_call")
    if streamed is None or hot is None or not streamed.points or not hot.points:
        return None
    per_layer = float(np.median(streamed.seconds())) - float(np.median(hot.seconds()))
    return per_layer / float(np.median(streamed.sizes()))


def skinny_side(name: str) -> int:
    """'skinny_fp32_n4096' -> 4096."""
    return int(name.rsplit("_n", 1)[1])


def fit_rows(series: dict, primary_dtype: str, peak: float, launch: float, prefix: str = "skinny"):
    """Fraction of peak FLOP/s per token-row count M from the skinny GEMM series.

    Per side n: 2 M n^2 / (peak x (time - launch)), the rate the weight GEMM reached at M rows
    (memory time included: where streaming the weight dominates, the fraction reproduces that
    time and the engine's bandwidth term decides anyway). Over the sides, the median per M;
    then the same monotone, never-faster-when-larger cleanup as the other tables.
    `prefix` "skinny" reads the F.linear series ([out, in] weights), "skinny_io" the [in, out] ones.
    Returns (None, "") when there is no such series."""
    names = sorted((n for n, s in series.items() if n.startswith(f"{prefix}_{primary_dtype}_n") and s.points),
                   key=skinny_side)
    if not names:
        return None, ""
    per_rows: dict[float, list[float]] = {}
    for name in names:
        s, side = series[name], skinny_side(name)
        flops = 2.0 * s.sizes() * side * side
        for rows, frac in zip(s.sizes(), raw_efficiency(flops, s.seconds(), peak, launch)):
            per_rows.setdefault(float(rows), []).append(float(frac))
    rows = sorted(per_rows)
    sizes, fractions = consistent_table(rows, [float(np.median(per_rows[r])) for r in rows])
    return TableCurve(sizes, fractions), f"{', '.join(names)} (median over sides per row count)"
