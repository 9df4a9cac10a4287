"""`python -m sim.validate`: predictions against published results and measured runs, error in plain sight.

    python -m sim.validate                         # results/validate-<UTC timestamp>/validation-report.md + .png
    python -m sim.validate --update-docs           # regenerate the committed docs/validation-report.md + png
    python -m sim.validate --json                  # also print one JSON object (points, mape, max_error, ...)
    python -m sim.validate --out /tmp/v --measured traces/data/cpu --references my_refs.csv

Inputs:
  - published reference points: sim/references/*.csv, one citation per row (sim/validation/references.py);
  - measured timing folders: every folder under traces/data/ whose manifest.json says kind "kvsim-timing"
    (written by `python -m traces.timing`, CPU or GPU), predicted on the hardware file its manifest names.
Every point is predicted through the engine's public entries with the profile of the stack it ran.
"""
from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from hwmodels.calibrate.hostinfo import contended
from sim.validation.measured import find_timing_folders, load_timing
from sim.validation.noise import noise_summary
from sim.validation.points import collect, is_flagged, stats
from sim.validation.published_report import build_section as published_gpu_section
from sim.validation.references import load_references
from sim.validation.report import (PLOT_NAME, POINTS_NAME, build_markdown, parity_plot, targets, write_points,
                                   write_report)

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "docs"
DEFAULT_THRESHOLD = 10.0


class _Parser(argparse.ArgumentParser):
    def error(self, message):   # one line and exit code 2, as every kvsim CLI
        raise ValueError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m sim.validate",
                description="Validate kvsim's predictions against published results and measured runs.")
    p.add_argument("--out", type=Path, default=None, metavar="DIR",
                   help="folder for validation-report.md, validation-parity.png and validation-points.csv "
                        "(default: results/validate-<UTC timestamp>/; an existing folder's report is replaced)")
    p.add_argument("--update-docs", action="store_true",
                   help="write into the repository's docs/ (the committed report and plot) instead of --out")
    p.add_argument("--json", action="store_true", help="print one JSON object with the statistics to stdout")
    p.add_argument("--measured", nargs="+", type=Path, default=None, metavar="DIR",
                   help="timing folders, or folders to search for them (default: everything under traces/data/)")
    p.add_argument("--no-measured", action="store_true", help="published references only")
    p.add_argument("--references", nargs="+", type=Path, default=None, metavar="CSV",
                   help="reference files (default: sim/references/*.csv)")
    p.add_argument("--no-references", action="store_true", help="measured points only")
    p.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD,
                   help="flag points whose |error| exceeds this many percent (default 10)")
    p.add_argument("--published-gpu", type=Path, default=None, metavar="CSV",
                   help="published GPU measurements for the engine-profile section (default: "
                        "../shared/data/gpu-published-train.csv, or $KVSIM_DATA; skipped when absent)")
    p.add_argument("--no-published-gpu", action="store_true", help="no published-GPU (engine profile) section")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def output_folder(out, update_docs: bool) -> Path:
    """Where the report goes: --out, docs/ with --update-docs, else a fresh results/validate-<timestamp>/."""
    if update_docs and out is not None:
        raise ValueError("--update-docs writes to docs/; give either it or --out, not both")
    if update_docs:
        return DEFAULT_OUT
    if out is None:
        return Path("results") / f"validate-{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}"
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is an existing file; --out names a folder (the report, plot and points go in it)")
    for parent in out.parents:
        if parent.exists() and not parent.is_dir():
            raise ValueError(f"--out {out}: {parent} is a file, not a folder")
    return out


def _short(path) -> str:
    """A path relative to the repository when it is inside it (reports must not name one machine's paths)."""
    try:
        return str(Path(path).resolve().relative_to(DEFAULT_OUT.parent))
    except ValueError:
        return str(path)


def hardware_notes(hw_names) -> list[str]:
    """One line per hardware file: calibrated from what (or datasheet)."""
    from sim.validation.predict import _device
    notes = []
    repo = Path(__file__).resolve().parents[1]
    for name in sorted(set(hw_names)):
        # Tables name hardware files relative to the repository (hw_display); resolve them from anywhere.
        device = _device(str(repo / name) if (repo / name).is_file() else name)
        cal = device.calibration
        if cal:
            series = ", ".join(sorted((cal.get("series") or {}).keys()))
            env = cal.get("env", {})
            notes.append(f"`{device.name}` ({_short(device.source_path)}): calibrated by {cal.get('tool')} ({cal.get('mode')} "
                         f"mode) on {cal.get('host')} {cal.get('date')}, {env.get('torch_threads')} thread(s), "
                         f"OMP_WAIT_POLICY={env.get('OMP_WAIT_POLICY')}, from microbenchmarks only: {series}. "
                         "No model run and no validation point is among its inputs.")
        else:
            notes.append(f"`{device.name}` ({_short(device.source_path)}): datasheet file (peaks and efficiency curves "
                         "from public sources, each cited in the file); not fitted to any validation point.")
    return notes


def setting_warnings(sources) -> list[str]:
    """Mismatches between how a timing folder was measured and how its hardware file was calibrated."""
    from sim.validation.predict import _device
    warnings = []
    for s in sources:
        cal = _device(s.hw).calibration or {}
        cal_threads = (cal.get("env") or {}).get("torch_threads")
        threads = s.manifest.get("env", {}).get("threads")
        if cal_threads is not None and threads is not None and int(cal_threads) != int(threads):
            warnings.append(f"`{s.name}` was measured with {threads} thread(s) but `{s.hw_label}` was calibrated with "
                            f"{cal_threads}: bandwidth and FLOP rates differ between the two settings")
        table = s.table
        if "cpu_median_s" in table.columns and (table.get("threads") == 1).all():
            ratio = float((table["median_s"] / table["cpu_median_s"]).median())
            if ratio > 1.2:
                warnings.append(f"`{s.name}`: median wall time is {ratio:.2f}x the thread's CPU time: the points "
                                "were measured while other processes competed for the CPU (timings inflated); "
                                "remeasure on a quiet machine")
        if cal.get("mode") == "quick":
            warnings.append(f"`{s.hw_label}` is a QUICK calibration (warm caches, few sizes): not for predictions")
        load = cal.get("load_average") or {}
        if cal.get("device") == "cpu" and contended(load.get("before"), load.get("own_threads", 0.0)):
            own = f", {load['own_threads']:g} of it its own threads" if load.get("own_threads") else ""
            warnings.append(f"`{s.hw_label}` was calibrated at load average {float(load['before'][0]):.1f}{own} (other "
                            "processes running): its bandwidth and FLOP rates may be understated")
    return list(dict.fromkeys(warnings))


def _finite(value: float):
    return round(float(value), 3) if np.isfinite(value) else None


def summary_json(points, threshold: float, out_path: Path, sources) -> dict:
    by_regime = stats(points)
    by_source = stats(points, "source")
    return {
        "points": int(len(points)),
        "threshold_pct": threshold,
        "above_threshold": int(is_flagged(points, threshold).sum()),
        "mape": {row.group: round(row.mape, 3) for row in by_regime.itertuples()},
        "max_error": {row.group: round(row.max_error, 3) for row in by_regime.itertuples()},
        "points_by_regime": {row.group: int(row.points) for row in by_regime.itertuples()},
        # the measurement's own scatter between rounds (NaN -> null for groups without rounds)
        "noise_floor": {row.group: _finite(row.noise_floor) for row in by_regime.itertuples()},
        "measurement_noise": [{k: (round(v, 3) if isinstance(v, float) else
                                   [round(m, 3) for m in v] if isinstance(v, list) else v) for k, v in row.items()}
                              for row in noise_summary(points, threshold)],
        "by_origin_regime": {row.group: {"points": int(row.points), "mape": round(row.mape, 3),
                                         "max_error": round(row.max_error, 3)}
                             for row in stats(points, ["origin", "regime"]).itertuples()},
        "by_source": {row.group: {"points": int(row.points), "mape": round(row.mape, 3),
                                  "max_error": round(row.max_error, 3)} for row in by_source.itertuples()},
        "targets": [{k: (None if isinstance(v, float) and not np.isfinite(v) else v) for k, v in t.items()}
                    for t in targets(points, threshold)],
        "measured_folders": [str(s.path) for s in sources],
        "report": str(out_path),
    }


def main(argv=None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if not args.threshold > 0:
            raise ValueError(f"--threshold must be a positive percentage, got {args.threshold}")
        args.out = output_folder(args.out, args.update_docs)
        refs = load_references(args.references)
        if args.no_references:
            refs = refs.iloc[0:0]
        folders = [] if args.no_measured else find_timing_folders(args.measured)
        sources = [load_timing(f) for f in folders]
        if not len(refs) and not sources:
            raise ValueError("nothing to validate: no reference rows and no timing folders")
        points, compare = collect(refs, sources, show_progress=not args.quiet and not args.json)
        hw_notes = hardware_notes(list(points["hw"])) + [f"WARNING: {w}" for w in setting_warnings(sources)]
        markdown = build_markdown(points, compare, sources, refs, args.threshold, PLOT_NAME, hw_notes)
        if args.published_gpu is not None and not args.published_gpu.is_file():
            raise FileNotFoundError(f"--published-gpu {args.published_gpu}: no such file")
        gpu = None if args.no_published_gpu else published_gpu_section(csv=args.published_gpu)
        if gpu is not None:
            markdown = markdown.rstrip("\n") + "\n\n" + "\n".join(gpu.markdown)
        args.out.mkdir(parents=True, exist_ok=True)
        parity_plot(points, args.out / PLOT_NAME, args.threshold)
        write_points(points, args.out / POINTS_NAME)
        path = write_report(markdown, args.out)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        summary = summary_json(points, args.threshold, path, sources)
        summary["published_gpu"] = gpu.summary if gpu is not None else None
        print(json.dumps(summary))
    else:
        overall = stats(points).iloc[-1]
        flagged = int(is_flagged(points, args.threshold).sum())
        print(f"{len(points)} points, MAPE {overall.mape:.1f}%, max |error| {overall.max_error:.1f}%, "
              f"{flagged} above {args.threshold:g}%: {path}")
        overall_gpu = (gpu.summary.get("regimes") or {}).get("overall") if gpu is not None else None
        if overall_gpu:
            print(f"published GPU: {overall_gpu['points']} rows, trtllm in-sample MAPE {overall_gpu['in_sample_mape']:.1f}%, "
                  f"LOSO MAPE {overall_gpu['loso_mape']:.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
