"""The CLI kit shared by every kvsim command (sim, hwmodels, keyformer, traces): a user mistake is one
`error: ...` line and exit code 2 (never a traceback), list-valued flags, output files written atomically.

    parser = OneLineParser(prog="python -m pkg.tool", formatter_class=DefaultsHelpFormatter)
    ...
    sys.exit(run(main))        # ValueError / FileNotFoundError / ... from the library -> `error: ...`, exit 2
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Callable

# What a user mistake raises in library code (docs/ARCHITECTURE.md): a message, not a traceback.
USER_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError, KeyError)


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
            return [kind(t) for t in items]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name}: cannot read {text!r} as a comma-separated list") from None
    return parse


def positive_int(text: str) -> int:
    """argparse type for an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


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
