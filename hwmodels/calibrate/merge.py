"""Merge several calibrations of one device into one hardware file. Pure numpy + yaml, no torch.

    python -m hwmodels.calibrate --merge A.yaml B.yaml [...] --out X.yaml [--name NAME]

On a shared machine the memory bandwidth drifts over tens of seconds, so one calibration catches one
phase. Repeating it (e.g. once per round of `traces.timing --rounds`) and keeping, per series and size,
the median over the runs gives numbers that describe the conditions the whole measurement saw. The
merged series go through the same fit() and build_document() as a single run, so the file is
schema-checked like any other.

Only series and sizes present in EVERY run are kept: a median over fewer runs would weigh those points
differently from the rest (runs of one plan always have the same points, so nothing is lost then).
`partial=True` (`--partial-series`) keeps a series that only some runs have (runs of a newer plan that
measures more), as the median over the runs that have it, and the file's `notes` name each such series
with its run count.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import yaml

from ..errors import HardwareFileError
from ..registry import load_device
from .document import Provenance, build_document, busiest_start, write_and_check
from .fit import Series, fit

# Env entries that Provenance holds in their own fields; the rest are backend settings.
OWN_ENV_KEYS = ("OMP_WAIT_POLICY", "torch_threads", "timer")
# What must agree between runs for their median to mean one device in one setting.
SAME = (("device", lambda c: c.get("device")), ("mode", lambda c: c.get("mode")),
        ("host", lambda c: c.get("host")), ("thread count", lambda c: (c.get("env") or {}).get("torch_threads")))


def merge_series(runs: list[dict], partial: bool = False) -> dict:
    """name -> Series, per size the median of the runs' seconds; a series or size missing from any run
    is dropped (see the module docstring), unless `partial`: then a series is merged over the runs that
    have it. Names and sizes keep the order of the first run that has them."""
    if not runs:
        raise ValueError("nothing to merge: no calibration runs given")
    merged, names = {}, list(dict.fromkeys(name for run in runs for name in run))
    for name in names:
        having = [run for run in runs if name in run]
        if len(having) < len(runs) and not partial:
            continue
        first = having[0][name]
        if any(run[name].size_kind != first.size_kind for run in having):
            raise ValueError(f"series {name} measures different sizes across runs "
                             f"({', '.join(sorted({run[name].size_kind for run in having}))})")
        per_run = [dict(run[name].points) for run in having]
        series = Series(name, first.what, first.size_kind)
        for size, _ in first.points:
            if all(size in points for points in per_run):
                series.add(size, float(np.median([points[size] for points in per_run])))
        if series.points:
            merged[name] = series
    return merged


def series_from_calibration(calibration: dict) -> dict:
    """Rebuild name -> Series from a calibrated file's `calibration.series` block (the raw medians,
    written with 5 significant digits)."""
    out = {}
    for name, block in (calibration.get("series") or {}).items():
        series = Series(name, block["what"], block["size"])
        for size, seconds in block["points_size_seconds"]:
            series.add(size, seconds)
        out[name] = series
    return out


def read_calibrated(path: Path) -> dict:
    """The YAML mapping of a calibrated hardware file; ValueError (one line) when it is not one."""
    path = Path(path)
    try:
        load_device(path)   # schema check first: a broken file is reported as the loader says
    except HardwareFileError as exc:
        raise ValueError(str(exc)) from None
    doc = yaml.safe_load(path.read_text())
    if not isinstance(doc.get("calibration"), dict) or not doc["calibration"].get("series"):
        raise ValueError(f"{path}: not a calibrated file (no calibration.series block; datasheet files "
                         "cannot be merged)")
    return doc


def _check_same(paths: list[Path], docs: list[dict]) -> None:
    for what, get in SAME:
        values = [get(doc["calibration"]) for doc in docs]
        if len(set(map(str, values))) > 1:
            listing = ", ".join(f"{p.name}: {v}" for p, v in zip(paths, values))
            raise ValueError(f"cannot merge calibrations of different {what}s ({listing})")


def _memory_how(doc: dict) -> str:
    """How the memory capacity was read: the detail that Provenance.source() put after 'median; '."""
    return doc["memory_capacity"].get("source", "").rpartition("median; ")[2] or "from the merged calibrations"


def merged_provenance(paths: list[Path], docs: list[dict]) -> Provenance:
    last = docs[-1]["calibration"]
    env = dict(last.get("env") or {})
    runs = tuple({"file": p.name, "date": str(d["calibration"].get("date")),
                  "load_average": d["calibration"].get("load_average"),
                  "wall_time_s": d["calibration"].get("wall_time_s")} for p, d in zip(paths, docs))
    # The busiest start among the runs (others' load): the contention warning then fires if any run was
    # contended.
    busiest, own = busiest_start([d["calibration"].get("load_average") or {} for d in docs])
    return Provenance(
        device=last["device"], mode=last["mode"], host=last["host"], date=str(last["date"]),
        omp_wait_policy=str(env.get("OMP_WAIT_POLICY")), torch_version=str(last["versions"]["torch"]),
        threads=int(env["torch_threads"]), repeats=int(last["repeats"]), timer=str(env.get("timer")),
        wall_time_s=sum(float(d["calibration"].get("wall_time_s") or 0.0) for d in docs),
        load_before=busiest, own_load=own, load_after=(last.get("load_average") or {}).get("after"),
        llc_bytes=last.get("last_level_cache"), pool_bytes=int(last["pool_bytes"]),
        settings={k: v for k, v in env.items() if k not in OWN_ENV_KEYS},
        python_version=str(last["versions"]["python"]), numpy_version=str(last["versions"]["numpy"]),
        merged_from=runs)


def merge_files(paths, out: Path, name: str | None = None, partial: bool = False):
    """Write `out`: the median of the calibrated files `paths`, refitted; returns the loaded Device.
    `partial`: keep series only some runs have (merge_series). Raises ValueError with a one-line message
    for unusable inputs."""
    paths = [Path(p) for p in paths]
    docs = [read_calibrated(p) for p in paths]
    _check_same(paths, docs)
    runs = [series_from_calibration(d["calibration"]) for d in docs]
    series = merge_series(runs, partial=partial)
    counts = {n: sum(n in run for run in runs) for n in series}
    fewer = {n: c for n, c in counts.items() if c < len(runs)}
    first = docs[0]
    primary = first["compute_efficiency"].get("reference_dtype") or "fp32"
    result = fit(series, primary)
    doc = build_document(name or first["name"], first["description"],
                         float(first["memory_capacity"]["value"]) * 1e9, _memory_how(first),
                         result, series, merged_provenance(paths, docs), primary)
    if fewer:
        having = {n: [p.name for p, run in zip(paths, runs) if n in run] for n in fewer}
        doc["notes"] = ("; ".join(f"{n}: median over {fewer[n]} of the {len(runs)} runs ({', '.join(having[n])})"
                                  for n in fewer)
                        + " (series the other runs' plan did not measure; merged with --partial-series)")
    return write_and_check(Path(out), doc)
