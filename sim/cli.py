"""Shared command-line plumbing: one-line errors with exit code 2, list flags, atomic writes."""
from __future__ import annotations

import argparse
import sys
from typing import Callable

from hwmodels.cli import OneLineParser, atomic_write_bytes, atomic_write_text, atomic_writer, fail  # noqa: F401

# What a user mistake raises in library code (docs/ARCHITECTURE.md): message, not traceback.
USER_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError, KeyError)


class UserError(ValueError):
    """A CLI input problem found outside the library (e.g. a bad combination of flags)."""


# One implementation for every kvsim CLI (hwmodels.cli): one-line errors, atomic writes.
ArgumentParser = OneLineParser


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


