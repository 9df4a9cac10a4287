"""`python -m sim.validate`'s command line (sim/validate.py runs it): flags, where the report goes, and the
steps: load the inputs, collect the points, analyse them, write the report, plot and points."""
from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

from sim.cli import ArgumentParser, run
from sim.validation.analysis import REPO_ROOT, analyse
from sim.validation.measured import find_timing_folders, load_timing
from sim.validation.parity_plot import parity_plot
from sim.validation.points import collect
from sim.validation.hf_fit_report import build_section as hf_fit_section
from sim.validation.published_plot import PLOT_NAME as GPU_PLOT_NAME
from sim.validation.published_plot import parity_plot as published_parity_plot
from sim.validation.published_report import build_section as published_gpu_section
from sim.validation.references import load_references
from sim.validation.report import PLOT_NAME, POINTS_NAME, build_markdown, summary_json, write_points, write_report

DEFAULT_OUT = REPO_ROOT / "docs"
DEFAULT_THRESHOLD = 10.0


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m sim.validate",
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
    runs = p.add_argument_group("measured benchmark runs (sim.validation.measured_run): replayed in the DES")
    runs.add_argument("--measured-run", nargs="+", type=Path, default=None, metavar="FILE",
                      help="vLLM `bench serve --save-result` JSON, SGLang `bench_serving` JSONL or `trtllm-bench "
                           "--report_json` files; each run is replayed (same lengths, arrivals, concurrency) and "
                           "every measured metric compared; only these are validated")
    runs.add_argument("--hw", default=None, help="--measured-run: the accelerator the runs used (the files do not say)")
    runs.add_argument("--model", default=None, help="--measured-run: the model (default: the one the file names)")
    runs.add_argument("--tp", type=int, default=None, help="--measured-run: tensor-parallel devices (default: the "
                                                          "file's, else 1)")
    runs.add_argument("--profile", default=None, help="--measured-run: engine profile (default: vllm for vLLM and "
                                                      "SGLang, trtllm / trtllm-pytorch for TensorRT-LLM)")
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


def _main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if not args.threshold > 0:
        raise ValueError(f"--threshold must be a positive percentage, got {args.threshold}")
    if args.measured_run is not None:
        return _measured_runs(args)
    for flag in ("hw", "model", "tp", "profile"):
        if getattr(args, flag) is not None:
            raise ValueError(f"--{flag} applies to --measured-run")
    args.out = output_folder(args.out, args.update_docs)
    refs = load_references(args.references)
    if args.no_references:
        refs = refs.iloc[0:0]
    folders = [] if args.no_measured else find_timing_folders(args.measured)
    sources = [load_timing(f) for f in folders]
    if args.published_gpu is not None and not args.published_gpu.is_file():
        raise FileNotFoundError(f"--published-gpu {args.published_gpu}: no such file")
    gpu = None if args.no_published_gpu else published_gpu_section(csv=args.published_gpu)
    if not len(refs) and not sources:
        if gpu is None or "skipped" in gpu.summary:
            raise ValueError("nothing to validate: no reference rows, no timing folders and no published GPU CSV")
        return _published_gpu_only(args, gpu)
    points, compare = collect(refs, sources, show_progress=not args.quiet and not args.json)
    validation = analyse(points, compare, sources, refs, args.threshold)
    markdown = build_markdown(validation, PLOT_NAME)
    if gpu is not None:
        markdown = markdown.rstrip("\n") + "\n\n" + "\n".join(gpu.markdown)
    hf_lines, hf_summary = ([], None) if args.no_measured else hf_fit_section()
    if hf_lines:
        markdown = markdown.rstrip("\n") + "\n\n" + "\n".join(hf_lines)
    args.out.mkdir(parents=True, exist_ok=True)
    parity_plot(points, args.out / PLOT_NAME, args.threshold)
    _gpu_plot(gpu, args.out)
    write_points(points, args.out / POINTS_NAME)
    path = write_report(markdown, args.out)
    if args.json:
        summary = summary_json(validation, path)
        summary["published_gpu"] = gpu.summary if gpu is not None else None
        summary["hf_fit"] = hf_summary
        print(json.dumps(summary))
    else:
        overall = validation.by_regime.iloc[-1]
        flagged = len(validation.flagged)
        print(f"{len(points)} points, MAPE {overall.mape:.1f}%, max |error| {overall.max_error:.1f}%, "
              f"{flagged} above {args.threshold:g}%: {path}")
        line = _gpu_line(gpu)
        if line:
            print(line)
    return 0


def _gpu_line(gpu) -> str | None:
    """The published-GPU section's one-line summary, None without predicted single-device rows."""
    overall = (gpu.summary.get("regimes") or {}).get("overall") if gpu is not None else None
    if not overall:
        return None
    return (f"published GPU: {overall['points']} rows, trtllm in-sample MAPE {overall['in_sample_mape']:.1f}%, "
            f"LOSO MAPE {overall['loso_mape']:.1f}%")


def _gpu_plot(gpu, out: Path) -> None:
    if gpu is not None and gpu.table is not None:
        published_parity_plot(gpu.table, gpu.summary.get("multi_gpu") or [], out / GPU_PLOT_NAME)


def _published_gpu_only(args, gpu) -> int:
    """`--no-references --no-measured` with a published GPU CSV (a held-out check): that section alone."""
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    markdown = "\n".join(["# kvsim validation report: published GPU measurements", "",
                          f"Generated by `python -m sim.validate` on {now} with no reference rows and no timing "
                          "folders: the engine-profile section only. How to read it: docs/validation.md.", "",
                          *gpu.markdown])
    path = write_report(markdown, args.out)
    _gpu_plot(gpu, args.out)
    line = _gpu_line(gpu)
    if args.json:
        print(json.dumps({"report": str(path), "published_gpu": gpu.summary}))
    elif line:
        print(f"{line}: {path}")
    else:
        print(f"published GPU: no single-device row predicted: {path}")
    return 0


def _measured_runs(args) -> int:
    """--measured-run: read every file (a wrong one is one error line, nothing written), replay each run,
    then write measured-runs.md and measured-runs.json into the output folder."""
    from sim.cli import atomic_write_text
    from sim.validation import measured_run_replay as replay
    from sim.validation.measured_run import load_measured_runs
    if args.update_docs:
        raise ValueError("--measured-run writes its own report: give --out (or nothing), not --update-docs")
    if args.tp is not None and args.tp < 1:
        raise ValueError(f"--tp must be >= 1, got {args.tp}")
    out = output_folder(args.out, False)
    runs = [run for path in args.measured_run for run in load_measured_runs(path)]
    if args.hw is None:
        raise ValueError("--measured-run: benchmark files do not name the accelerator: give --hw (e.g. --hw h100-sxm)")
    comparisons = [replay.compare(run, hw=args.hw, model=args.model, profile=args.profile, tp=args.tp)
                   for run in runs]
    command = "python -m sim.validate --measured-run " + " ".join(map(str, args.measured_run)) + f" --hw {args.hw}" \
        + (f" --model {args.model}" if args.model else "")
    summary = {"command": command, "runs": [c.to_dict() for c in comparisons]}
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "measured-runs.md", replay.markdown(comparisons, command))
    atomic_write_text(out / "measured-runs.json", json.dumps(summary, indent=1, default=_json_default) + "\n")
    if args.json:
        print(json.dumps({**summary, "report": str(out / "measured-runs.md")}, default=_json_default))
    else:
        print("\n".join(replay.text_lines(comparisons)))
        print(f"report: {out / 'measured-runs.md'}")
    return 0


def _json_default(value):
    """numpy numbers, and inf / NaN as strings (strict JSON)."""
    import math
    value = value.item() if hasattr(value, "item") else value
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def main(argv=None) -> int:
    """User mistakes (bad flags, missing files) are one `error: ...` line and exit code 2 (the kit's run)."""
    return run(_main, argv)
