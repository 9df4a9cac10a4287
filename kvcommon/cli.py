"""The CLI kit shared by every kvsim command (sim, hwmodels, keyformer, traces): a user mistake is one
`error: ...` line and exit code 2 (never a traceback), list-valued flags, output files written atomically.

    parser = OneLineParser(prog="python -m pkg.tool", formatter_class=DefaultsHelpFormatter)
    ...
    sys.exit(run(main))        # ValueError / FileNotFoundError / ... from the library -> `error: ...`, exit 2
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

# What a user mistake raises in library code (docs/ARCHITECTURE.md): a message, not a traceback.
# OverflowError: an integer too large for numpy's int64 that got past the flag checks (a YAML value, say).
USER_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError, KeyError,
               OverflowError)

# An integer flag beyond this is a typo, not a size: larger values overflow numpy's int64 arithmetic
# (token counts times bytes per token), and 2^53 is the largest integer a float holds exactly.
INT_LIMIT = 2**53


def checked_int(text: str) -> int:
    """int(text) for a flag, refusing values beyond INT_LIMIT (ValueError naming the limit)."""
    value = int(text)
    if abs(value) > INT_LIMIT:
        raise ValueError(f"{text!r} is beyond 2^53, the largest integer accepted")
    return value


class OneLineParser(argparse.ArgumentParser):
    """argparse prints usage plus the message; a user mistake here is one line, exit code 2."""

    def error(self, message):
        fail(f"{message} (see --help)")


def fail(message: str, code: int = 2):
    """Print `error: message` on stderr and exit (code 2: a user mistake)."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(code)


def error_line(exc: BaseException) -> str:
    """The one line a user error is shown as: its message's first line (a KeyError's key unquoted)."""
    message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
    text = str(message)
    return text.splitlines()[0] if text.strip() else type(exc).__name__


def run(main: Callable[[list[str] | None], int | None], argv=None) -> int:
    """Call `main(argv)`, turning user errors into one line on stderr and exit code 2."""
    try:
        return main(argv) or 0
    except SystemExit as exc:     # argparse: --help (0) or a bad flag (2, message already printed)
        return exc.code if isinstance(exc.code, int) else 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:       # `... | head`: not an error of ours
        return 0
    except USER_ERRORS as exc:
        print(f"error: {error_line(exc)}", file=sys.stderr)
        return 2


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Adds "(default: X)" to an option's help unless the help already says its default, or there is
    none worth saying (None, False); choices are listed by argparse in the metavar."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text.lower() or action.default in (None, False, argparse.SUPPRESS) \
                or action.option_strings == [] or isinstance(action, argparse._HelpAction):
            return text
        return f"{text} (default: %(default)s)" if text else "(default: %(default)s)"


def csv_list(kind: Callable, name: str):
    """argparse type for comma-separated values: `--batches 1,8,32` -> [1, 8, 32]."""
    def parse(text: str):
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"{name}: empty list")
        try:
            return [checked_int(t) if kind is int else kind(t) for t in items]
        except ValueError as exc:
            detail = " (integers of at most 2^53)" if "2^53" in str(exc) else ""
            raise argparse.ArgumentTypeError(f"{name}: cannot read {text!r} as a comma-separated list{detail}") from None
    return parse


def positive_int(text: str) -> int:
    """argparse type for an integer >= 1 (and <= INT_LIMIT)."""
    try:
        value = checked_int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer up to 2^53, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    """argparse type for an integer >= 0 (a seed, a count that may be zero), <= INT_LIMIT."""
    try:
        value = checked_int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer from 0 to 2^53, got {text!r}")
    return value


def parse_part(text: str) -> tuple[int, int]:
    """--part 'K/N' -> (K, N) with 1 <= K <= N: a worker's share of a job split over N workers."""
    try:
        k, n = (int(x) for x in str(text).split("/"))
    except ValueError:
        raise ValueError(f"--part must be K/N (e.g. 1/2), got {text!r}") from None
    if not 1 <= k <= n:
        raise ValueError(f"--part K/N needs 1 <= K <= N, got {text!r}")
    return k, n


def progress_disabled(wanted: bool = True) -> bool:
    """tqdm's `disable` for a bar on stderr: off when not `wanted`, else shown on a terminal only (no
    carriage-return spam in logs and pipes). KVSIM_PROGRESS=1 forces bars on, KVSIM_PROGRESS=0 off."""
    if not wanted:
        return True
    force = os.environ.get("KVSIM_PROGRESS", "").strip()
    if force in ("0", "1"):
        return force == "0"
    try:
        return not sys.stderr.isatty()
    except (AttributeError, ValueError):    # replaced or closed stderr
        return True


def atomic_writer(path: Path, write: Callable[[Path], None]) -> None:
    """Let `write(tmp_path)` produce the file (pandas, matplotlib, yaml), then move it into place, so a
    reader never sees half a file and an interrupted run leaves the old one."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp" + path.suffix)   # keep the suffix: writers pick formats by it
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def atomic_write_bytes(path: Path, data: bytes) -> None:
    atomic_writer(path, lambda tmp: tmp.write_bytes(data))


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def check_out_folder(flag: str, path) -> Path:
    """An output folder a tool will create (or fill): checked before any work, so a typo costs no run.
    Refuses an empty name, an existing file, a path under a file and a parent this user cannot write in;
    returns the path. Nothing is created."""
    if path is None or not str(path).strip():
        raise ValueError(f"{flag}: empty folder name")
    target = Path(path).expanduser()
    if target.exists() and not target.is_dir():
        raise ValueError(f"{flag} {path} is an existing file; {flag} names a folder")
    parent = target
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"{flag} {path}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {path}: cannot write in {parent} (permission denied)")
    return target


@contextmanager
def staged_folder(out: Path, owned: tuple[str, ...] = ()) -> Iterator[Path]:
    """Write an output folder's files into a temporary sibling, moved into `out` only when the block
    finishes: an interrupted or failed run leaves no partial set of outputs (an existing `out` keeps its
    old files, a new one is not created). Files already in `out` that the run rewrites are replaced;
    `owned` names files of a previous run that go when this run did not write them (a stale points.csv)."""
    out = Path(out).expanduser().resolve()     # `--out .` has a name once resolved
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = out.with_name(f".{out.name}.partial-{os.getpid()}")
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir()
    try:
        yield stage
        if not out.exists():
            os.replace(stage, out)
        else:
            for name in owned:
                if not (stage / name).exists():
                    (out / name).unlink(missing_ok=True)
            for item in sorted(stage.rglob("*")):
                if item.is_file():
                    dest = out / item.relative_to(stage)
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(item, dest)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
