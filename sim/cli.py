"""Shared command-line plumbing: one-line errors with exit code 2, list flags, atomic writes."""
from __future__ import annotations

import argparse
import sys
from typing import Callable

from hwmodels.cli import (DefaultsHelpFormatter, OneLineParser, atomic_write_bytes, atomic_write_text,  # noqa: F401
                          atomic_writer, fail, progress_disabled)

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


def duration(seconds) -> str:
    """A latency in the unit that reads best: 812 us, 54.98 ms, 22.03 s, 14.2 min, 3.1 h; '-' for None/NaN."""
    if seconds is None or seconds != seconds:
        return "-"
    s = float(seconds)
    if abs(s) >= 3600:
        return f"{s / 3600:.1f} h"
    if abs(s) >= 60:
        return f"{s / 60:.1f} min"
    if abs(s) >= 1:
        return f"{s:.2f} s"
    if abs(s) >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.0f} us"


def output_file(flag: str, path) -> None:
    """An output file's folder must exist (a typo must not silently create a tree); one-line error."""
    from pathlib import Path
    target = Path(path)
    if target.is_dir():
        raise UserError(f"{flag} {path} is a folder; give a file name")
    if not target.parent.is_dir():
        raise UserError(f"{flag}: folder {target.parent} does not exist")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value




def check_context(model, tokens: int, what: str = "prompt + gen") -> str | None:
    """Requests beyond a model's trained context: with learned absolute positions there is no position
    embedding past max_positions, so the run is impossible (UserError); with RoPE or ALiBi it runs but
    nothing was trained there: returns a warning line (None when within the context or it is unknown)."""
    limit = getattr(model, "max_positions", None)
    if not limit or tokens <= limit:
        return None
    if model.positional == "learned":
        raise UserError(f"{what} = {tokens} tokens, but {model.name} has learned absolute positions for "
                        f"{limit} tokens only (no position embedding beyond them); keep {what} <= {limit}")
    scheme = {"rope": "RoPE", "alibi": "ALiBi"}.get(model.positional, model.positional)
    return (f"{what} = {tokens} tokens exceeds {model.name}'s trained context of {limit} positions ({scheme}): "
            "the model runs there, but its quality is untested; the numbers are a what-if")
