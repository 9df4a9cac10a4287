"""`python -m workflows.gpu.run_all`: the one-command GPU run of issue 8 (calibration, decode latency under
eviction, real traces), inside a fixed time budget, leaving partial results at every point.

    python -m workflows.gpu.run_all                         # on a GPU: the full plan, 450 s budget
    python -m workflows.gpu.run_all --device cpu --tiny     # the same stages at tiny shapes (< 1 min on a CPU)

Stages, each a project CLI in a child process with its own time limit (workflows/gpu/stages.py):
  calibrate  python -m hwmodels.calibrate --device D       -> RUN/hw/<gpu>-calibrated.yaml
  timing     python -m traces.timing, one child per model: GPT-J-6B and MPT-7B shapes with random bf16 weights
             built on the GPU, full and keyformer at 0.2/0.5/1.0, batch 1 and 8, contexts 1024 and 4096, plus
             peak memory                                   -> RUN/timing/<model>/ (kvsim-timing folders)
  capture    python -m traces.capture: stories260K over the TinyStories sample under full, keyformer and h2o
                                                           -> RUN/traces/stories260k/tinystories/ (trace folder)
Then RUN/summary.csv + RUN/summary.txt (printed), RUN/run.json (what ran, how long, why anything stopped),
and, when $OUT is set (the device machine) or --pack names a folder, one RUN.tar.gz there, rewritten after
every stage so an outside kill loses at most the stage in flight. The run folder itself stays outside $OUT:
only 8 files, 2 folders deep, come back from there.

Exit codes: 0 every stage finished; 3 results are partial (a stage failed, timed out or was skipped);
2 a usage mistake; 130 interrupted (what finished is still packed).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from datetime import datetime, timezone
from pathlib import Path

from traces.assets import REPO_ROOT, have_assets
from workflows.gpu.plan import DATASHEETS, STAGES, Plan, make_plan, write_timing_configs
from workflows.gpu.stages import StageInterrupted, StageResult, run_stage

CARRY_ASSETS = REPO_ROOT / ".carry" / "assets"
RUN_KIND = "kvsim-gpu-run"
CAPTURE_ASSETS = (("stories260K", "hf"), ("long_text", "tinystories_sample.txt"))


class UsageError(ValueError):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m workflows.gpu.run_all",
                description="Calibrate the GPU, time decode steps of GPT-J-6B/MPT-7B shapes under eviction, "
                            "capture stories260K traces; all inside one time budget.")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--tiny", action="store_true", help="tiny shapes and few points: checks every stage in < 1 min")
    p.add_argument("--out", type=Path, default=None,
                   help="run folder (default results/gpu-<gpu>-<plan>-<UTC time>); an existing run folder resumes")
    p.add_argument("--pack", type=Path, default=None,
                   help="folder for RUN.tar.gz, rewritten after each stage (default: $OUT when set, else none)")
    p.add_argument("--budget-s", type=float, default=None,
                   help="seconds for the whole run (default 450 on a GPU, 480 for --tiny)")
    p.add_argument("--skip", action="append", default=[], choices=STAGES, help="leave a stage out (repeatable)")
    p.add_argument("--hw", default=None,
                   help="hardware file (copied into the run) or hwmodels name to predict the timing points on, "
                        "instead of calibrating")
    return p


PREFLIGHT = """
import json, importlib.metadata as md, torch
def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None
cuda = torch.cuda.is_available()
print(json.dumps({"torch": torch.__version__, "cuda_runtime": torch.version.cuda, "cuda_available": cuda,
                  "gpu": torch.cuda.get_device_name(0) if cuda else None, "torch_threads": torch.get_num_threads(),
                  "transformers": version("transformers"), "numpy": version("numpy"), "pandas": version("pandas"),
                  "pyarrow": version("pyarrow")}))
"""


def preflight(env: dict) -> dict:
    """Versions and the GPU as the stages' interpreter sees them (a few seconds: torch is imported)."""
    try:
        proc = subprocess.run([sys.executable, "-c", PREFLIGHT], capture_output=True, text=True, env=env,
                              timeout=120, check=False)
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        detail = (proc.stderr.strip().splitlines() or ["no output"])[-1] if "proc" in locals() else "did not start"
        raise UsageError(f"{sys.executable} cannot import torch ({detail})") from None


def gpu_slug(name: str) -> str:
    """'NVIDIA H200' -> 'h200', 'NVIDIA A100-SXM4-80GB' -> 'a100'; 'cuda' when the name has no model number."""
    match = re.search(r"\b([A-Z]+\d+[A-Z]?)\b", name.replace("NVIDIA", ""))
    return match.group(1).lower() if match else "cuda"


def gpu_facts() -> dict:
    try:
        out = subprocess.run(["nvidia-smi", ("--query-gpu=name,memory.total,driver_version,clocks.max.sm,"
                                              "clocks.max.mem,power.limit"), "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {}
    return {"nvidia_smi": out} if out else {}


def child_env(device: str) -> dict:
    env = dict(os.environ)
    if device == "cpu":
        # One thread everywhere on a CPU: calibration and timing then run the same setting, and spinning
        # OpenMP threads (OMP_WAIT_POLICY=ACTIVE) do not fight over a small shared machine.
        env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env.setdefault("OMP_WAIT_POLICY", "ACTIVE")
    # No network on the device machine: a hub lookup would wait for a timeout instead of failing.
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env["TQDM_DISABLE"] = "1"       # logs hold lines, not carriage-return progress bars
    env["PYTHONUNBUFFERED"] = "1"   # a stopped stage's log ends where it stopped
    return env


def use_carried_assets() -> str:
    """Point KVSIM_ASSETS at .carry/assets (what prepare_carry.sh copies) when present and not set."""
    if not os.environ.get("KVSIM_ASSETS") and CARRY_ASSETS.is_dir():
        os.environ["KVSIM_ASSETS"] = str(CARRY_ASSETS)
    from traces.assets import assets_dir
    path = assets_dir()
    return os.path.relpath(path, REPO_ROOT) if path.is_relative_to(REPO_ROOT) else str(path)


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def pack(run_dir: Path, pack_dir: Path | None) -> Path | None:
    """RUN.tar.gz of the whole run folder in `pack_dir` (atomic), plus summary.txt beside it when there."""
    if pack_dir is None:
        return None
    pack_dir.mkdir(parents=True, exist_ok=True)
    target = pack_dir / f"{run_dir.name}.tar.gz"
    tmp = target.with_name(target.name + ".tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        tar.add(run_dir, arcname=run_dir.name,
                filter=lambda info: None if info.name.endswith(".tmp") else info)
    os.replace(tmp, target)
    if (run_dir / "summary.txt").exists():
        shutil.copyfile(run_dir / "summary.txt", pack_dir / "summary.txt")
    return target


class Run:
    """The state of one run: its folder, plan, deadline and the stage results so far (run.json)."""

    def __init__(self, plan: Plan, run_dir: Path, pack_dir: Path | None, slug: str, gpu_name: str, skip,
                 started: float | None = None, threads: int = 1):
        self.plan, self.dir, self.pack_dir = plan, run_dir, pack_dir
        self.threads = threads   # torch's default thread count in the stages' environment (preflight)
        self.started = started or time.time()   # the budget counts from the command's start
        self.deadline = self.started + plan.total_s - plan.pack_reserve_s
        self.env = child_env(plan.device)
        self.slug, self.gpu_name = slug, gpu_name
        self.to_run = [s for s in STAGES if s not in skip]
        self.results: list[StageResult] = []
        self.record = {"kind": RUN_KIND, "schema_version": 1, "plan": plan.to_dict(), "device_name": gpu_name,
                       "gpu_slug": slug, "datasheet_hw": DATASHEETS.get(slug),
                       "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                       "python": sys.version.split()[0], "assets": os.environ.get("KVSIM_ASSETS", ""),
                       "skipped_by_user": sorted(skip), "stages": []}
        self.record.update(gpu_facts() if plan.device == "cuda" else {})

    def limit(self, stage: str) -> float:
        """Seconds this stage may take: its cap, less what later stages are guaranteed."""
        later = self.to_run[self.to_run.index(stage) + 1:]
        reserved = sum(self.plan.reserve_s[s] for s in later)
        return max(0.0, min(self.plan.caps_s[stage], self.deadline - time.time() - reserved))

    def add(self, result: StageResult) -> None:
        self.results.append(result)
        line = f"[{result.stage}] {result.status} in {result.wall_s:.1f} s (limit {result.limit_s:.0f} s)"
        print(line + (f": {result.reason}" if result.reason else ""), file=sys.stderr, flush=True)
        self.save()

    def save(self, final: bool = False) -> None:
        self.record["stages"] = [r.to_dict() for r in self.results]
        self.record["wall_s"] = round(time.time() - self.started, 1)
        self.record["complete"] = final and all(r.status == "ok" for r in self.results)
        write_json(self.dir / "run.json", self.record)
        pack(self.dir, self.pack_dir)

    def python(self, *args: str) -> list[str]:
        return [sys.executable, "-m", *args]


def stage_calibrate(run: Run) -> str:
    """Returns the hardware file (path or name) the timing points are predicted on."""
    name = f"{run.slug}-calibrated"
    out = run.dir / "hw" / f"{name}.yaml"
    fallback = DATASHEETS.get(run.slug, "cpu-local" if run.plan.device == "cpu" else run.slug)
    if "calibrate" not in run.to_run:
        return fallback
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists():
        from hwmodels import load_device
        try:
            load_device(out)
            run.add(StageResult("calibrate", "ok", reason=f"kept {out.name} from an earlier run"))
            return str(out)
        except (ValueError, FileNotFoundError):
            out.unlink()
    argv = run.python("hwmodels.calibrate", "--device", run.plan.device, "--out", str(out), "--name", name)
    if run.plan.calibrate_quick:
        argv.append("--quick")
    result = run_stage("calibrate", argv, run.dir / "logs" / "calibrate.log", run.limit("calibrate"), run.env, run.dir)
    run.add(result)
    if result.status == "ok" and out.exists():
        return str(out)
    print(f"[calibrate] timing points will name the datasheet file {fallback!r} instead", file=sys.stderr)
    return fallback


def stage_timing(run: Run, hw: str) -> None:
    if "timing" not in run.to_run:
        return
    configs = write_timing_configs(run.plan, run.dir / "configs")
    end = time.time() + run.limit("timing")
    models = list(run.plan.models)
    for i, model in enumerate(models):
        limit = (end - time.time()) / (len(models) - i)   # an early finish passes its time on
        # --threads: torch's default, the setting hwmodels.calibrate runs and records, so sim.validate
        # compares like with like (traces.timing's own default is 1 thread, for quiet CPU timings).
        argv = run.python("traces.timing", "--model", str(configs[model]), "--out", str(run.dir / "timing"),
                          "--hw", hw, "--threads", str(run.threads), *run.plan.timing_argv())
        run.add(run_stage(f"timing:{model}", argv, run.dir / "logs" / f"timing-{model}.log", limit, run.env, run.dir))


def stage_capture(run: Run) -> None:
    if "capture" not in run.to_run:
        return
    cap = run.plan.capture
    missing = [("/".join(parts)) for parts in CAPTURE_ASSETS if not have_assets(*parts)]
    if missing:
        run.add(StageResult("capture", "skipped", reason=f"assets missing under {os.environ.get('KVSIM_ASSETS') or '../shared/assets'}: "
                            f"{', '.join(missing)} (run workflows/gpu/prepare_carry.sh and carry .carry)"))
        return
    argv = run.python("traces.capture", "--model", cap.model, "--dataset", cap.dataset, "--n", str(cap.n),
                      "--max-new-tokens", str(cap.max_new_tokens), "--cache-ratios",
                      ",".join(f"{r:g}" for r in cap.cache_ratios), "--device", run.plan.device,
                      "--dtype", cap.dtype, "--out", str(run.dir / cap.folder()), "--no-progress")
    for policy in cap.policies:
        argv += ["--policy", policy]
    run.add(run_stage("capture", argv, run.dir / "logs" / "capture.log", run.limit("capture"), run.env, run.dir))


def finish(run: Run) -> str:
    """summary.csv, summary.txt, the final run.json and pack. The results are on disk already: a summary
    that cannot be made (a bug meeting new data) is reported in summary.txt and must not cost the pack."""
    from workflows.gpu.summary import collect_timing, render

    run.record["wall_s"] = round(time.time() - run.started, 1)
    run.record["stages"] = [r.to_dict() for r in run.results]
    try:
        collect_timing(run.dir).to_csv(run.dir / "summary.csv", index=False, float_format="%.6g")
        text = render(run.dir, run.record)
    except Exception as exc:  # noqa: BLE001 - see the docstring
        text = f"summary failed ({type(exc).__name__}: {exc}); the run folder holds every result\n"
    (run.dir / "summary.txt").write_text(text)
    run.save(final=True)
    return text


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv=None) -> int:
    started = time.time()
    try:
        args = build_parser().parse_args(argv)
        plan = make_plan(args.device, args.tiny, args.budget_s)
        if args.budget_s is not None and args.budget_s <= plan.pack_reserve_s + 10:
            raise UsageError(f"--budget-s {args.budget_s:g} is too short to run anything")
        if args.hw is not None:
            args.skip.append("calibrate")
        if args.hw and args.hw.endswith((".yaml", ".yml")):
            if not Path(args.hw).is_file():
                raise UsageError(f"--hw {args.hw}: no such hardware file")
            args.hw = str(Path(args.hw).resolve())   # the stages run from the repository root
        facts = preflight(child_env(args.device))
        if args.device == "cuda" and not facts["cuda_available"]:
            raise UsageError(f"--device cuda: torch {facts['torch']} sees no CUDA device here "
                             "(use --device cpu --tiny to check the stages on a CPU)")
        gpu_name = facts["gpu"] if args.device == "cuda" else "cpu"
        slug = gpu_slug(gpu_name) if args.device == "cuda" else "cpu"
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        run_dir = (args.out or REPO_ROOT / "results" / f"gpu-{slug}-{plan.name}-{stamp}").resolve()
        if run_dir.exists() and any(run_dir.iterdir()) and not (run_dir / "run.json").exists():
            raise UsageError(f"--out {run_dir} exists and is not a run folder")
        pack_dir = args.pack or (Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
        if pack_dir is not None and (pack_dir.resolve() == run_dir or run_dir in pack_dir.resolve().parents):
            raise UsageError("--pack must not be the run folder or a folder inside it")
    except (UsageError, ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    assets = use_carried_assets()
    run_dir.mkdir(parents=True, exist_ok=True)
    run = Run(plan, run_dir, pack_dir, slug, gpu_name, set(args.skip), started, int(facts["torch_threads"]))
    run.record["assets"] = assets
    run.record["versions"] = facts
    print(f"run folder {run_dir} ({plan.name} plan on {gpu_name}, budget {plan.total_s:.0f} s, assets {assets})",
          file=sys.stderr, flush=True)
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)  # an outside timeout still packs what finished
    code = 0
    if args.hw and args.hw.endswith((".yaml", ".yml")):
        # A copy travels with the results, so the timing manifests' relative path to it survives ingest.
        copy = run_dir / "hw" / Path(args.hw).name
        copy.parent.mkdir(parents=True, exist_ok=True)
        if Path(args.hw).resolve() != copy.resolve():
            shutil.copyfile(args.hw, copy)
        args.hw = str(copy)
    try:
        hw = args.hw or stage_calibrate(run)
        run.record["timing_hw"] = os.path.relpath(hw, run_dir) if hw.endswith((".yaml", ".yml")) else hw
        stage_timing(run, hw)
        stage_capture(run)
    except StageInterrupted as exc:
        run.results.append(exc.result)
        code = 130
    except KeyboardInterrupt:
        code = 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    text = finish(run)
    sys.stdout.write(text)
    if code:
        print(f"interrupted: finished stages are in {run_dir}", file=sys.stderr)
        return code
    packed = f"; packed into {pack_dir / (run_dir.name + '.tar.gz')}" if pack_dir else ""
    print(f"run folder {run_dir}{packed}", file=sys.stderr)
    return 0 if all(r.status == "ok" for r in run.results) else 3


if __name__ == "__main__":
    sys.exit(main())
