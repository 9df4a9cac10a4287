"""Command-line plumbing shared by every kvsim CLI (sim, hwmodels, keyformer, traces): a user mistake is one
`error: ...` line and exit code 2, and output files are written atomically. It lives here because hwmodels
is the bottom layer: every package may import it, and it needs no torch."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Callable


class OneLineParser(argparse.ArgumentParser):
    """argparse prints usage plus the message; a user mistake here is one line, exit code 2."""

    def error(self, message):
        fail(f"{message} (see --help)")


def fail(message: str, code: int = 2):
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(code)


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


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Adds "(default: X)" to an option's help unless the help already says its default, or there is
    none worth saying (None, False); choices are listed by argparse in the metavar."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text.lower() or action.default in (None, False, argparse.SUPPRESS) \
                or action.option_strings == [] or isinstance(action, argparse._HelpAction):
            return text
        return f"{text} (default: %(default)s)" if text else "(default: %(default)s)"


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
