"""`python -m traces.timing`: the command line. The grid's flags are TimingGrid's fields (traces.timing.grid);
the rest (models, output, rounds, calibration, priority) belong to the run."""
from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from kvcommon.cli import OneLineParser, check_out_folder, progress_disabled, run
from kvcommon.fields import add_flags, from_args, help_of
from traces.assets import DATA_DIR
from traces.timing.calibration import RoundCalibration
from traces.timing.configs import max_positions, resolve_config
from traces.timing.grid import (DEFAULT_BATCHES, DEFAULT_CONTEXTS, DEFAULT_MODELS, DEFAULT_POLICIES,
                                DEFAULT_PREFILL, HF_DEFAULTS, PolicyPoint, TimingGrid)
from traces.timing.rounds import measure_grid
from traces.timing_format import TimingError, TimingFolder

# The committed grids (tracked files: written only with --update-data) and where a run goes by default.
DATA_OUT = {"kvsim": DATA_DIR / "cpu", "hf": DATA_DIR / "cpu-hf"}
RESULTS_OUT = {"kvsim": Path("results") / "timing" / "cpu", "hf": Path("results") / "timing" / "cpu-hf"}


def _prefill_list(text: str) -> tuple[int, ...]:
    """--prefill: comma-separated lengths, or 'none' (or empty) for no prefill points."""
    if text in ("", "none"):
        return ()
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        values = ()
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers or 'none', got {text!r}")
    return values


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m traces.timing",
                      description="Measure decode-step latency of the project's policies on random-weight models.")
    p.add_argument("--model", action="append", default=None,
                   help="CPU shape name (traces/data/cpu/configs), sim model name, or config.json path; "
                        f"repeatable (default: {', '.join(DEFAULT_MODELS)})")
    add_flags(p, TimingGrid, ["stack", "attn"])
    # stack-dependent defaults (HF_DEFAULTS) are resolved in main: None here means "not given"
    add_flags(p, TimingGrid, ["beams", "batches", "contexts"], defaults={"beams": None, "batches": None, "contexts": None})
    p.add_argument("--policy", action="append", default=None, dest="policies", metavar="POLICY",
                   help=help_of(TimingGrid, "policies"))
    p.add_argument("--prefill", type=_prefill_list, default=None, dest="prefill_contexts", metavar="PREFILL",
                   help=help_of(TimingGrid, "prefill_contexts"))
    add_flags(p, TimingGrid, ["repeats", "warmup", "threads", "dtype", "device"])
    p.add_argument("--hw", default=None,
                   help="hwmodels device name or hardware YAML these points are predicted on (default for cpu: "
                        "traces/data/cpu/cpu-local-1t.yaml at 1 thread, else cpu-local)")
    add_flags(p, TimingGrid, ["seed"])
    p.add_argument("--out", type=Path, default=None,
                   help="output root (default: results/timing/cpu, or results/timing/cpu-hf for --stack hf)")
    p.add_argument("--update-data", action="store_true",
                   help="write into the committed grid instead (traces/data/cpu or traces/data/cpu-hf: tracked files)")
    p.add_argument("--fresh", action="store_true", help="discard finished points instead of resuming")
    p.add_argument("--rounds", type=int, default=1,
                   help="measure the grid round-robin this many times (every model and point once per round); "
                        "statistics over all rounds' samples. A higher value on a finished folder adds rounds")
    p.add_argument("--calibrate", type=Path, default=None, metavar="FILE.yaml",
                   help="run the hwmodels.calibrate microbenchmarks before every model of every round (kept in "
                        "<out>/calibration-rounds/) and write FILE.yaml, their merge, as the hardware file the "
                        "points are predicted on (replaces --hw)")
    p.add_argument("--quick-calibration", action="store_true",
                   help="with --calibrate: the quick plan (seconds, warm caches): for tests, not for predictions")
    p.add_argument("--high-priority", action="store_true",
                   help="autogroup nice -20 and nice -20 (Linux, root); with `setsid` in front, on a shared "
                        "machine one thread then keeps a core to itself")
    return p


def grid_from_args(args) -> TimingGrid:
    """The grid of the parsed flags, with --stack hf's own defaults where a flag was not given."""
    hf = args.stack == "hf"
    return from_args(TimingGrid, args,
                     batches=args.batches or (HF_DEFAULTS["batches"] if hf else DEFAULT_BATCHES),
                     contexts=args.contexts or (HF_DEFAULTS["contexts"] if hf else DEFAULT_CONTEXTS),
                     policies=tuple(PolicyPoint.parse(p) for p in (
                         args.policies or (HF_DEFAULTS["policies"] if hf else DEFAULT_POLICIES))),
                     prefill_contexts=args.prefill_contexts if args.prefill_contexts is not None else (
                         HF_DEFAULTS["prefill"] if hf else DEFAULT_PREFILL),
                     beams=args.beams if args.beams is not None else (HF_DEFAULTS["beams"] if hf else 1))


def raise_priority() -> str:
    """Raise this process's scheduling share: autogroup nice -20 and nice -20 (Linux, root or CAP_SYS_NICE).

    On a shared machine with autogroup scheduling, `nice` alone only orders processes inside one session;
    the session's autogroup nice sets its share against every other session (start the command with
    `setsid` to give it a session of its own; Ctrl-C then no longer reaches it: stop it with `kill`).
    With one torch thread the measurement then keeps one core to itself (the other processes keep the
    rest), which `cpu_median_s` ~= `median_s` confirms. Returns what was achieved, for the manifest."""
    done = []
    try:
        Path("/proc/self/autogroup").write_text("-20")
        done.append("autogroup nice -20")
    except OSError:
        pass
    try:
        os.nice(-20 - os.nice(0))
        done.append("nice -20")
    except OSError:
        pass
    return ", ".join(done) or "unchanged (not permitted)"


ONE_THREAD_HW = DATA_DIR / "cpu" / "cpu-local-1t.yaml"


def default_hw(threads: int) -> str:
    """The CPU hardware file calibrated with the same thread count: bandwidth and FLOP rates depend on it.

    hwmodels' `cpu-local` is calibrated with torch's default threads; the one-thread calibration that the
    committed grid uses lives beside the grid (regenerate: docs/validation.md)."""
    if threads == 1 and ONE_THREAD_HW.is_file():
        return str(ONE_THREAD_HW)
    return "cpu-local"


def round_calibration(args, grid: TimingGrid, out: Path) -> RoundCalibration | None:
    """The --calibrate plan (None without it), its arguments checked."""
    if args.calibrate is None:
        if args.quick_calibration:
            raise TimingError("--quick-calibration needs --calibrate FILE.yaml")
        return None
    target = Path(args.calibrate)
    if args.hw is not None:
        raise TimingError("--calibrate FILE.yaml writes the hardware file the points are predicted on: drop --hw")
    from hwmodels.calibrate.cli import output_problem   # torch-free: the same checks as calibrate --out
    if target.parent.resolve() == Path(out).resolve():
        Path(out).mkdir(parents=True, exist_ok=True)     # the output root the run creates anyway
    problem = output_problem("--calibrate", target)
    if problem:
        raise TimingError(problem)
    if not target.stem or any(c.isspace() for c in target.stem):
        raise TimingError(f"--calibrate: the file name names the device; one word please, got {target.name!r}")
    device = "cuda" if grid.device.startswith("cuda") else "cpu"
    return RoundCalibration(target, out / "calibration-rounds", device, args.quick_calibration, grid.threads)


def _interrupt_on_term(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """The measurement; a user mistake is one `error:` line and exit code 2 (kvcommon.cli.run)."""
    # `kill` (SIGTERM) stops a background run as cleanly as Ctrl-C: finished points are already on disk.
    previous = signal.signal(signal.SIGTERM, _interrupt_on_term)
    try:
        return run(_main, argv)
    finally:
        signal.signal(signal.SIGTERM, previous)


def output_root(args, grid: TimingGrid) -> Path:
    """--out, the committed grid with --update-data, else results/timing/<cpu|cpu-hf>; checked, not created."""
    if args.update_data and args.out is not None:
        raise TimingError("--update-data writes the committed grid under traces/data/: give it or --out, not both")
    if args.device != "cpu" and args.out is None:
        raise TimingError("--device other than cpu needs --out (e.g. traces/data/h200) and --hw (e.g. h200)")
    stack = "hf" if grid.stack == "hf" else "kvsim"
    out = args.out if args.out is not None else (DATA_OUT if args.update_data else RESULTS_OUT)[stack]
    return check_out_folder("--out", out)


def check_hw(hw_device: str) -> None:
    """--hw must load (a name or a hardware file) before any point is measured: a bogus name would be
    written into every manifest and refused only later by sim.validate."""
    import hwmodels     # torch-free
    if hw_device.endswith((".yaml", ".yml")) and not Path(hw_device).is_file():
        raise TimingError(f"--hw {hw_device}: no such hardware file")
    try:
        hwmodels.load_device(hw_device)
    except (ValueError, KeyError, FileNotFoundError) as exc:
        message = str(exc.args[0] if isinstance(exc, KeyError) and exc.args else exc).splitlines()[0]
        raise TimingError(f"--hw {hw_device!r}: {message}") from None


def _main(argv: list[str] | None) -> int:
    try:
        args = build_parser().parse_args(argv)
        grid = grid_from_args(args)
        if args.hw is not None and not args.hw.strip():
            raise TimingError("--hw must not be empty (leave it out for the CPU's own hardware file)")
        if args.device != "cpu" and args.hw is None:
            raise TimingError("--device other than cpu needs --out (e.g. traces/data/h200) and --hw (e.g. h200)")
        out = output_root(args, grid)
        if args.rounds < 1:
            raise TimingError(f"--rounds must be >= 1, got {args.rounds}")
        calibration = round_calibration(args, grid, Path(out))
        hw_device = str(args.calibrate) if calibration else (args.hw or default_hw(grid.threads))
        if calibration is None:
            check_hw(hw_device)
        models = [resolve_config(m) for m in (args.model or DEFAULT_MODELS)]
        if args.device.startswith("cuda"):
            import torch
            if not torch.cuda.is_available():
                raise TimingError(f"--device {args.device}: no CUDA device here")
        priority = raise_priority() if args.high_priority else "default"
        longest = max(max(grid.contexts) + grid.warmup + grid.repeats + 1, max(grid.prefill_contexts, default=0))
        for name, config in models:
            limit = max_positions(config)
            if limit is not None and longest > limit:
                raise TimingError(f"model {name} has {limit} positions but the grid needs {longest} "
                                  f"(context {max(grid.contexts)} + {grid.warmup + grid.repeats + 1} steps): "
                                  "lower --context or raise the position limit in its config")
        for name, _ in models:   # refuse to mix settings before any bar or measurement starts
            TimingFolder.open(Path(out) / name, grid.settings(), args.fresh, args.rounds)
        from tqdm import tqdm
        total = args.rounds * len(models) * (len(grid.decode_points()) + len(grid.prefill_points()))
        with tqdm(total=total, desc="timing" if args.rounds == 1 else f"timing x{args.rounds} rounds", unit="pt",
                  file=sys.stderr, dynamic_ncols=True, disable=progress_disabled()) as progress:
            runs = measure_grid(models, grid, Path(out), hw_device, args.fresh, args.rounds, progress, priority,
                                calibration)
            for run in runs:
                progress.write(f"{run.name}: {run.folder.path}")
    except KeyboardInterrupt:
        print("interrupted: finished points are saved; rerun the same command to resume", file=sys.stderr)
        return 130
    return 0
