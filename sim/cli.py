"""sim's command-line helpers on top of the one CLI kit (kvcommon.cli: one-line errors with exit code 2,
list flags, atomic writes, re-exported here): readable durations, output-file checks, context limits."""
from __future__ import annotations

from kvcommon.cli import (USER_ERRORS, DefaultsHelpFormatter, OneLineParser, atomic_write_bytes,  # noqa: F401
                          atomic_write_text, atomic_writer, check_out_folder, checked_int, csv_list, fail,
                          non_negative_int, positive_int, progress_disabled, run, staged_folder)


class UserError(ValueError):
    """A CLI input problem found outside the library (e.g. a bad combination of flags)."""


# The kit's parser: one `error: ...` line and exit code 2 for a bad flag.
ArgumentParser = OneLineParser


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
