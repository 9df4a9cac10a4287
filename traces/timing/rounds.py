"""The grid measured round-robin: round r visits every model and point once (a point holding fewer than r
rounds gets one more) before round r+1 starts, so every point samples every phase of a drifting machine;
each model's folder is written after every point (traces.timing_format)."""
from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from traces.timing import configs, measure
from traces.timing.calibration import RoundCalibration
from traces.timing.grid import PolicyPoint, TimingGrid
from traces.timing_format import KIND, SCHEMA_VERSION, TimingFolder, point_key, rounds_of


def environment(grid: TimingGrid) -> dict:
    import torch
    import transformers

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    env = {"omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", ""), "threads": torch.get_num_threads(),
           "cpu": cpu, "logical_cpus": os.cpu_count(), "python": platform.python_version(),
           "torch": torch.__version__, "transformers": transformers.__version__, "numpy": np.__version__,
           "load_average_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}
    if grid.device.startswith("cuda"):
        env["gpu"] = torch.cuda.get_device_name(grid.device)
    return env


@dataclass
class ModelRun:
    """One model of the grid across the rounds: its folder stays open (and its rows in memory) between them."""
    name: str
    config: dict
    folder: TimingFolder
    hw_device: str      # as the manifest names it (a hardware file: relative to the folder)


def open_run(name: str, config: dict, grid: TimingGrid, out: Path, hw_device: str, fresh: bool,
             rounds: int) -> ModelRun:
    folder = TimingFolder.open(out / name, grid.settings(), fresh, rounds)
    if hw_device.endswith((".yaml", ".yml")):   # a hardware file path: stored relative to the folder
        hw_device = os.path.relpath(Path(hw_device).resolve(), (out / name).resolve())
    return ModelRun(name, config, folder, hw_device)


def rounds_done(run: ModelRun, grid: TimingGrid, rounds: int) -> int:
    """Point-rounds of the grid already in the folder (for the progress bar)."""
    points = grid.prefill_points() + grid.decode_points()
    return sum(min(rounds_of(row), rounds) for row in (run.folder.row(p) for p in points) if row is not None)


def build_manifest(run: ModelRun, model, grid: TimingGrid, rounds: int, priority: str) -> dict:
    return {
        "schema_version": SCHEMA_VERSION, "kind": KIND,
        "model": {"name": run.name, "source": run.config.get("_source", ""), "trained": False,
                  "n_params": int(sum(p.numel() for p in model.parameters())),
                  # the shape is config.json's (what sim reads): one source, nothing derived here to drift
                  "config": "config.json"},
        "hw_device": run.hw_device, "software": grid.software,
        "stack": grid.stack, "beams": grid.beams, "device": grid.device, "dtype": grid.dtype,
        "seed": grid.seed,
        "grid_settings": grid.settings(),
        "rounds": rounds,
        "grid": {"batches": list(grid.batches), "contexts": list(grid.contexts),
                 "policies": [p.label() for p in grid.policies], "prefill_contexts": list(grid.prefill_contexts)},
        "env": environment(grid) | {"scheduling": priority},
        "clock": "median_s etc.: time.perf_counter wall clock (synchronised on CUDA); cpu_median_s: "
                 "time.thread_time of the calling thread",
        "what": (f"median wall time of one {'beam-search' if grid.beams > 1 else 'greedy'} step (num_beams="
                 f"{grid.beams}, attn_implementation={grid.attn}) of transformers' "
                 "generate, between consecutive stopping-criteria calls, after a real prefill"
                 if grid.stack == "hf" else
                 "median wall time of one keyformer.generate.decode_one_token call from a synthetic_state "
                 "(phase decode) or of keyformer.generate.prefill (phase prefill)")
                + "; random weights; with rounds > 1, statistics over the samples of every round (the grid "
                  "is revisited round-robin)",
        "created": run.folder.manifest.get("created") or datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def measure_round(run: ModelRun, grid: TimingGrid, rnd: int, rounds: int, progress,
                  priority: str = "default") -> None:
    """Give every point of `grid` that holds fewer than `rnd` rounds one more round, written point by point."""
    import torch

    todo = [p for p in grid.prefill_points() + grid.decode_points() if point_key(p) not in run.folder.done(rnd)]
    if not todo:
        return
    torch.set_num_threads(grid.threads)
    # Rebuilt every round (same seed, same weights): one model in memory at a time, whatever the grid.
    model = configs.build_model(run.config, grid.dtype, grid.device, grid.seed, grid.attn)
    manifest = build_manifest(run, model, grid, rounds, priority)
    started, wall_before = time.time(), float(run.folder.manifest.get("wall_time_s", 0.0))
    for point in todo:
        progress.set_postfix_str(f"{run.name} round {rnd}/{rounds} {point['phase']} {point['policy']}:"
                                 f"{point['cache_ratio']:g} b{point['batch']} n{point['context']}")
        if point["phase"] == "prefill":
            result = measure.time_prefill(model, point["context"], grid)
        elif grid.stack == "hf":
            result = measure.time_hf_decode(model, point["batch"], point["context"], grid)
        else:
            result = measure.time_decode(model, PolicyPoint(point["policy"], point["cache_ratio"]),
                                 point["batch"], point["context"], grid)
        run.folder.add(measure.add_round(run.folder.row(point), point, result, grid.repeats) | {
            "repeats": grid.repeats, "warmup": grid.warmup, "threads": torch.get_num_threads(),
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", ""), "dtype": grid.dtype,
            "load_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan"),
            "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds")})
        manifest["wall_time_s"] = round(wall_before + time.time() - started, 1)
        run.folder.write(manifest, run.config)
        progress.update(1)


def measure_grid(models: list, grid: TimingGrid, out: Path, hw_device: str, fresh: bool, rounds: int,
                 progress, priority: str = "default", calibration: RoundCalibration | None = None) -> list:
    """Round-robin over the grid: round r visits every model and point once (a point holding fewer
    than r rounds gets one more) before round r+1 starts, so every point samples every phase of a
    drifting machine. Returns the runs (folders)."""
    runs = [open_run(name, config, grid, Path(out), hw_device, fresh, rounds) for name, config in models]
    if calibration is not None and fresh:
        calibration.clear()
    progress.update(sum(rounds_done(run, grid, rounds) for run in runs))
    for rnd in range(1, rounds + 1):
        for run in runs:
            if calibration is not None:
                calibration.before_block(rnd, run.name, progress)
            measure_round(run, grid, rnd, rounds, progress, priority)
    if calibration is not None:
        progress.write(calibration.merge(rounds, [run.name for run in runs]))
    return runs
