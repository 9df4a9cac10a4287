"""The calibrated hardware file: schema-conformant YAML, written atomically. No torch."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from kvcommon.cli import atomic_writer

from ..registry import load_device
from ..schema import SCHEMA_VERSION
from .fit import FitResult, table_document
from .fit_attention import attention_documents
from .hostinfo import contended, other_load


@dataclass(frozen=True)
class Provenance:
    """Where and how the numbers were measured; every source string is built from this."""
    device: str                  # "cpu" / "cuda"
    mode: str                    # "full" / "quick"
    host: str
    date: str                    # ISO 8601, UTC
    omp_wait_policy: str
    torch_version: str
    threads: int
    repeats: int
    timer: str
    wall_time_s: float
    load_before: list | None
    load_after: list | None
    llc_bytes: int | None
    pool_bytes: int
    settings: dict               # extra backend facts (e.g. cuda device, allow_tf32)
    python_version: str
    numpy_version: str
    # Set when the numbers are the median of several calibrations (merge.py): one mapping per
    # input run (file, date, load_average, wall_time_s), in input order.
    merged_from: tuple = ()
    # Busy threads of the calibrating process itself at the start (traces.timing --calibrate: its
    # measurement thread), excluded from the load average before the contention check.
    own_load: float = 0.0

    def __post_init__(self):
        if self.repeats < 1 or self.wall_time_s < 0:
            raise ValueError("repeats must be >= 1 and the wall time non-negative")

    def when(self) -> str:
        """The date, or for a merge the runs it is the median of."""
        if not self.merged_from:
            return self.date
        dates = [run["date"] for run in self.merged_from]
        return f"median over {len(dates)} calibration runs ({dates[0]} .. {dates[-1]})"

    def source(self, detail: str) -> str:
        return (f"measured: hwmodels.calibrate{' --quick' if self.mode == 'quick' else ''} on {self.host} "
                f"{self.when()}, OMP_WAIT_POLICY={self.omp_wait_policy}, torch {self.torch_version}, "
                f"{self.threads} threads, {self.repeats} repeats, median; {detail}")


def _round(x: float, digits: int = 4) -> float:
    return float(f"{x:.{digits}g}")


def _size(x: float):
    return int(x) if float(x).is_integer() else _round(x, 6)


def _q(value: float, unit: str, source: str) -> dict:
    return {"value": _round(value), "unit": unit, "source": source}


def build_document(name: str, description: str, memory_bytes: float, memory_how: str,
                   fit: FitResult, series: dict, prov: Provenance, primary_dtype: str) -> dict:
    """The YAML mapping of a calibrated device (units: GB, GB/s, GFLOP/s, us)."""
    gemv, gemm = f"gemv_{primary_dtype}", f"gemm_{primary_dtype}"
    dispatch_what = series["dispatch"].what
    doc = {
        "schema_version": SCHEMA_VERSION,
        "name": name,
        "description": description,
        "memory_capacity": _q(memory_bytes / 1e9, "GB", prov.source(f"{memory_how}")),
        "memory_bandwidth": _q(fit.memory_bw / 1e9, "GB/s", prov.source(
            f"best streaming read rate over the read and GEMV series: {fit.memory_bw_from}")),
        "peak_flops": {
            dtype: _q(rate / 1e9, "GFLOP/s", prov.source(
                f"best dense GEMM rate measured ({fit.flops_from[dtype]}), not a datasheet peak"))
            for dtype, rate in sorted(fit.flops.items())
        },
        "bw_efficiency": {
            "form": "table",
            "size_unit": "B",
            "points": [[s, f] for s, f in zip(fit.bw_table.sizes, fit.bw_table.fractions)],
            "source": prov.source(
                f"{gemv} series: fraction = bytes / (memory_bandwidth x (median time - launch_overhead)), "
                "isotonic fit, capped so no larger transfer is predicted faster"),
        },
        "compute_efficiency": {
            "form": "table",
            "size_unit": "FLOP",
            "points": [[s, f] for s, f in zip(fit.compute_table.sizes, fit.compute_table.fractions)],
            "source": prov.source(
                f"{gemm} series: fraction = FLOPs / (peak_flops.{primary_dtype} x (median time - "
                "launch_overhead)), isotonic fit, capped so no larger GEMM is predicted faster"),
            # the sizes are FLOPs at this dtype's peak: other dtypes are read at equal time-at-peak
            "reference_dtype": primary_dtype,
        },
        **({"gemm_rows_efficiency": table_document(fit.rows_table, "rows", prov.source(
            f"{fit.rows_from}: fraction = 2 M n^2 / (peak_flops.{primary_dtype} x (median time - "
            "launch_overhead)), isotonic fit, capped so no larger GEMM is predicted faster"))}
           if fit.rows_table is not None else {}),
        **({"gemm_rows_in_out_efficiency": table_document(fit.rows_in_out_table, "rows", prov.source(
            f"{fit.rows_in_out_from}: weights stored [in, out] (torch.addmm, as transformers' Conv1D); fraction "
            f"= 2 M n^2 / (peak_flops.{primary_dtype} x (median time - launch_overhead)), isotonic fit, capped so "
            "no larger GEMM is predicted faster"))}
           if fit.rows_in_out_table is not None else {}),
        **attention_documents(fit.attention, prov.source),
        **({"fresh_alloc_efficiency": table_document(fit.fresh_alloc, "B", prov.source(
            "fresh_copy, fresh_copy_ref: copy time into an existing buffer / into a newly allocated tensor "
            "of the same size, per tensor size; capped at 1"))} if fit.fresh_alloc is not None else {}),
        "launch_overhead": _q(fit.launch_overhead_s * 1e6, "us", prov.source(f"dispatch: {dispatch_what}")),
        "host_overhead": _q(fit.host_overhead_s * 1e6, "us",
                            prov.source(f"host_step: {series['host_step'].what}")),
        **({"eager_call_overhead": _q(fit.eager_call_overhead_s * 1e6, "us", prov.source(
            f"eager_call: {series['eager_call'].what}; value = time per layer / top-level calls per layer"))}
           if fit.eager_call_overhead_s is not None else {}),
        **({"eager_weight_switch_overhead": _q(fit.eager_switch_s * 1e6, "us", prov.source(
            f"eager_stream: {series['eager_stream'].what}; value = (its time per layer - eager_call's) / "
            "streamed weights per layer"))} if fit.eager_switch_s is not None else {}),
        "notes": (_what_notes(prov) + " Raw medians are under calibration.series; regenerate with "
                  "python -m hwmodels.calibrate."
                  + (" QUICK MODE: few sizes, warm caches; for tests, not for predictions."
                     if prov.mode == "quick" else "")
                  + (f" WARNING: measured under CPU contention (load average {prov.load_before[0]} at "
                     f"start{_own_note(prov.own_load)}): timings are inflated; regenerate on a quiet machine."
                     if prov.device == "cpu" and contended(prov.load_before, prov.own_load) else "")),
        "calibration": {
            "tool": "hwmodels.calibrate",
            "mode": prov.mode,
            "device": prov.device,
            "host": prov.host,
            "date": prov.date,
            "wall_time_s": round(prov.wall_time_s, 2),
            "env": {"OMP_WAIT_POLICY": prov.omp_wait_policy, "torch_threads": prov.threads,
                    "timer": prov.timer, **prov.settings},
            "versions": {"torch": prov.torch_version, "python": prov.python_version,
                         "numpy": prov.numpy_version},
            "repeats": prov.repeats,
            "statistic": (f"median over {len(prov.merged_from)} calibration runs of: " if prov.merged_from else "")
                         + "median over repeats of the mean time per call within a sample",
            "load_average": {"before": prov.load_before, "after": prov.load_after,
                             **({"own_threads": prov.own_load} if prov.own_load else {})},
            "last_level_cache": prov.llc_bytes,
            "pool_bytes": prov.pool_bytes,
            **({"merged_from": list(prov.merged_from)} if prov.merged_from else {}),
            "fit": (f"memory_bandwidth from {fit.memory_bw_from}; bw_efficiency from {gemv}; "
                    f"compute_efficiency from {gemm}; see hwmodels/calibrate/fit.py"),
            "series": {
                s.name: {"what": s.what, "size": s.size_kind,
                         "points_size_seconds": [[_size(x), _round(t, 5)] for x, t in s.points]}
                for s in series.values()
            },
        },
    }
    return doc


def _own_note(own_load: float) -> str:
    return f", {own_load:g} of it the calibrating process's own threads" if own_load else ""


def busiest_start(load_averages: list[dict]) -> tuple[list | None, float]:
    """(load average before, own threads) of the run whose start had the most load from others."""
    starts = [(list(la["before"]), float(la.get("own_threads") or 0.0))
              for la in load_averages if la and la.get("before")]
    return max(starts, key=lambda s: other_load(*s), default=(None, 0.0))


def _what_notes(prov: Provenance) -> str:
    if not prov.merged_from:
        return (f"Calibrated {prov.device} file ({prov.mode} mode) in {prov.wall_time_s:.1f} s; "
                f"load average before/after {prov.load_before}/{prov.load_after}.")
    runs = "; ".join(f"{run['date']} (load average before/after {(run['load_average'] or {}).get('before')}/"
                     f"{(run['load_average'] or {}).get('after')})" for run in prov.merged_from)
    return (f"Calibrated {prov.device} file ({prov.mode} mode): per series and size, the median over "
            f"{len(prov.merged_from)} calibration runs ({prov.wall_time_s:.1f} s in all): {runs}.")


class _NoAliasDumper(yaml.SafeDumper):
    """Repeat a value shared by two fields (e.g. a load average) instead of writing a YAML anchor."""

    def ignore_aliases(self, data):
        return True


def render(doc: dict) -> str:
    header = ("# Calibrated hardware file written by hwmodels.calibrate (schema: hwmodels/schema.py).\n"
              "# Every number is measured on this host by microbenchmarks; see each source.\n")
    body = yaml.dump(doc, Dumper=_NoAliasDumper, sort_keys=False, default_flow_style=None, width=10**6, allow_unicode=True)
    return header + body




def write_and_check(path: Path, doc: dict):
    """Write the file to a temporary name, load it back through the schema, and only then move it into
    place: a file the loader rejects (a bug in the fit) is never shipped, and never left behind."""
    text = render(doc)

    def write_checked(tmp: Path) -> None:
        tmp.write_text(text, encoding="utf-8")
        load_device(tmp)              # raises HardwareFileError; atomic_writer then removes tmp

    atomic_writer(path, write_checked)
    return load_device(path)
