"""Shared command-line plumbing: one-line errors with exit code 2, list flags, atomic writes."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Callable

# What a user mistake raises in library code (docs/ARCHITECTURE.md): message, not traceback.
USER_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError, KeyError)


class UserError(ValueError):
    """A CLI input problem found outside the library (e.g. a bad combination of flags)."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse that reports a bad flag as one `error: ...` line (no usage block) and exits 2."""

    def error(self, message):
        fail(f"{message} (see --help)")


def fail(message: str, code: int = 2):
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(code)


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
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"error: {str(message).splitlines()[0] if str(message) else type(exc).__name__}", file=sys.stderr)
        return 2


def csv_list(kind: Callable, name: str):
    """argparse type for comma-separated values: `--batches 1,8,32`."""
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
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_writer(path: Path, write: Callable[[Path], None]) -> None:
    """Let `write(tmp_path)` produce the file (pandas, matplotlib), then move it into place."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp" + path.suffix)   # keep the suffix: writers pick formats by it
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
