"""Running one stage of a GPU run: a project CLI in a child process, with a hard time limit and a log.

Why child processes: each stage frees its GPU memory when it exits, a crash (a CUDA error poisons the
process) costs one stage rather than the run, and a stage past its limit can be stopped from outside.
A stage past its limit gets SIGINT first: the project's CLIs turn it into KeyboardInterrupt and keep what
they finished (traces.timing and traces.capture write after every point/run); SIGKILL follows after a grace.
"""
from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from traces.assets import REPO_ROOT

GRACE_S = 15.0        # between SIGINT and SIGKILL
MIN_STAGE_S = 10.0    # a stage offered less than this is skipped, not started


@dataclass
class StageResult:
    stage: str                    # calibrate, timing:<model>, capture
    status: str                   # ok | failed | timed_out | skipped | interrupted
    wall_s: float = 0.0
    limit_s: float = 0.0
    returncode: int | None = None
    command: list = field(default_factory=list)
    log: str = ""                 # path relative to the run folder
    reason: str = ""              # one line: why it failed or was skipped

    def to_dict(self) -> dict:
        return asdict(self)


def last_error_line(log_path: Path) -> str:
    """The line that says what went wrong: the last `error:` line, else the last non-empty line."""
    try:
        lines = [line.strip() for line in log_path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    errors = [line for line in lines if line.startswith("error:")]
    return (errors or lines or [""])[-1][:300]


def _own_process_group() -> dict:
    """Popen arguments that put the child in a process group of its own (so it and its children can be
    signalled together) but in our session: whatever ends the session also ends the child."""
    if sys.version_info >= (3, 11):
        return {"process_group": 0}
    return {"preexec_fn": os.setpgrp}  # pragma: no cover - Python 3.10


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop(proc: subprocess.Popen, grace_s: float = GRACE_S) -> None:
    """SIGINT the child's process group, then SIGKILL it if it has not exited after `grace_s`."""
    _signal_group(proc, signal.SIGINT)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        _signal_group(proc, signal.SIGKILL)
        proc.wait()


def run_stage(stage: str, argv: list[str], log_path: Path, limit_s: float, env: dict,
              run_dir: Path, min_s: float = MIN_STAGE_S) -> StageResult:
    """Run `argv` with stdout+stderr into `log_path`; SIGINT at `limit_s - grace`, SIGKILL at `limit_s`.
    KeyboardInterrupt (the orchestrator itself interrupted) stops the child and propagates."""
    result = StageResult(stage, "ok", limit_s=round(limit_s, 1), command=list(argv),
                         log=os.path.relpath(log_path, run_dir))
    if limit_s < min_s:
        result.status, result.reason = "skipped", f"only {limit_s:.0f} s left in the run's budget"
        return result
    grace = min(GRACE_S, limit_s / 4)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with log_path.open("w") as log:
        log.write(f"$ {shlex.join(argv)}\n# limit {limit_s:.0f} s\n")
        log.flush()
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                cwd=REPO_ROOT, **_own_process_group())
        try:
            result.returncode = proc.wait(timeout=limit_s - grace)
        except subprocess.TimeoutExpired:
            stop(proc, grace)
            result.returncode = proc.returncode
            result.status = "timed_out"
            result.reason = f"stopped at its {limit_s:.0f} s limit; finished points are kept"
        except KeyboardInterrupt:
            stop(proc, min(grace, 5.0))
            result.returncode, result.status = proc.returncode, "interrupted"
            result.wall_s = round(time.perf_counter() - started, 1)
            raise StageInterrupted(result) from None
    result.wall_s = round(time.perf_counter() - started, 1)
    if result.status == "ok" and result.returncode != 0:
        result.status = "failed"
        result.reason = last_error_line(log_path) or f"exit code {result.returncode}"
    return result


class StageInterrupted(Exception):
    """The orchestrator was interrupted while a stage ran; carries the stage's result."""

    def __init__(self, result: StageResult):
        super().__init__(result.stage)
        self.result = result
