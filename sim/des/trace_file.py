"""Request traces on disk: one request per row with its arrival time and its prompt and output lengths.

Two spellings load as is:
- the Azure LLM inference trace 2023 (Splitwise, ISCA 2024): `TIMESTAMP` (a date and time),
  `ContextTokens`, `GeneratedTokens`;
- kvsim's replay files (sim.des.arrivals): `arrival_s` (seconds) and `prompt_tokens`, `output_tokens`
  (or the aliases listed there).

The two bundled traces are named `azure-code-2023` and `azure-conv-2023`; they are read from
`$KVSIM_DATA/azure-llm-inference-2023/`, else `../shared/data/azure-llm-inference-2023/` next to the
repository (the CSVs are not copied into it). Their license (CC-BY 4.0) asks for the attribution below,
which every output that replays them carries.

A trace that cannot be replayed as recorded is a ValueError naming the file, the row and the column:
a missing column, an unparsable, fractional or negative length, an unparsable time, timestamps out of
order (a trace is replayed in its rows' order; sort it first when that is what you mean).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

REPO_ROOT = Path(__file__).resolve().parents[2]
AZURE_FOLDER = "azure-llm-inference-2023"
BUNDLED = {"azure-code-2023": "AzureLLMInferenceTrace_code.csv",
           "azure-conv-2023": "AzureLLMInferenceTrace_conv.csv"}
AZURE_ATTRIBUTION = ("Azure LLM inference trace 2023 (Azure/AzurePublicDataset, CC-BY 4.0): P. Patel et al., "
                     "\"Splitwise: Efficient generative LLM inference using phase splitting\", ISCA 2024")

# (arrival, prompt, output) column names, one spelling per row of the tuple; the first present wins
TIME_COLUMNS = ("TIMESTAMP", "arrival_s", "arrival_time", "timestamp", "time_s", "arrival")
PROMPT_COLUMNS = ("ContextTokens", "prompt_tokens", "prompt_len", "input_len", "input_tokens", "prompt")
OUTPUT_COLUMNS = ("GeneratedTokens", "output_tokens", "output_len", "gen_len", "gen", "output")


@dataclass(frozen=True)
class RequestTrace:
    """A trace as recorded: arrival seconds from its first request (sorted), and the lengths."""

    arrival_s: np.ndarray       # float64, starts at 0, non-decreasing
    prompt_tokens: np.ndarray   # int64 >= 1
    output_tokens: np.ndarray   # int64 >= 1
    name: str                   # the bundled name or the path as given
    attribution: str | None     # the license's attribution line, when the trace asks for one

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def span_s(self) -> float:
        return float(self.arrival_s[-1] - self.arrival_s[0]) if len(self) else 0.0

    @property
    def mean_rate(self) -> float:
        """Requests per second as recorded: (n - 1) gaps over the span (inf when they all arrive at once)."""
        return (len(self) - 1) / self.span_s if self.span_s > 0 else float("inf")


def data_dir() -> Path:
    """KVSIM_DATA, else `../shared/data` next to the repository."""
    env = os.environ.get("KVSIM_DATA")
    return Path(env).expanduser() if env else REPO_ROOT.parent / "shared" / "data"


def bundled_path(name: str) -> Path:
    return data_dir() / AZURE_FOLDER / BUNDLED[name]


def resolve(spec: str | Path) -> tuple[Path, str, str | None]:
    """A bundled name or a path -> (file, display name, attribution or None). FileNotFoundError when absent."""
    spec = str(spec)
    if spec in BUNDLED:
        path = bundled_path(spec)
        if not path.is_file():
            raise FileNotFoundError(f"trace {spec}: {path} not found (the bundled traces are read from "
                                    f"$KVSIM_DATA/{AZURE_FOLDER}/ or ../shared/data/{AZURE_FOLDER}/)")
        return path, spec, AZURE_ATTRIBUTION
    path = Path(spec)
    if not path.is_file():
        raise FileNotFoundError(f"trace {spec} not found (a CSV/JSONL file, or one of {', '.join(BUNDLED)})")
    with path.open("rb") as fh:    # an excerpt of the Azure trace keeps its attribution
        head = fh.readline().decode("utf-8", "replace")
    return path, spec, AZURE_ATTRIBUTION if "ContextTokens" in head else None


def _read(path: Path) -> pd.DataFrame:
    try:
        if path.suffix.lower() in (".jsonl", ".ndjson"):
            return pd.read_json(path, lines=True, dtype=False)
        return pd.read_csv(path, dtype=str, keep_default_na=False, skipinitialspace=True)
    except (ValueError, pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"{path}: not a readable request trace ({first})") from None


def _column(frame: pd.DataFrame, names: tuple[str, ...], what: str, path: Path) -> str:
    for name in names:
        if name in frame.columns:
            return name
    found = ", ".join(map(str, frame.columns)) or "none"
    raise ValueError(f"{path}: no {what} column (expected one of {', '.join(names)}); found {found}")


def _bad_row(path: Path, mask: np.ndarray, column: str, frame: pd.DataFrame, problem: str) -> ValueError:
    i = int(np.flatnonzero(mask)[0])
    return ValueError(f"{path}: row {i + 2} (line {i + 2}), column {column}: {problem}, got "
                      f"{frame[column].iloc[i]!r} ({int(mask.sum())} such rows)")


def _lengths(frame: pd.DataFrame, column: str, path: Path) -> np.ndarray:
    values = pd.to_numeric(frame[column], errors="coerce").to_numpy(float)
    bad = ~np.isfinite(values)
    if bad.any():
        raise _bad_row(path, bad, column, frame, "not a number")
    bad = (values < 1) | (values != np.round(values))
    if bad.any():
        raise _bad_row(path, bad, column, frame, "lengths must be whole numbers >= 1 token")
    return values.astype(np.int64)


def _seconds(frame: pd.DataFrame, column: str, path: Path) -> np.ndarray:
    """Seconds since the first row: numbers are seconds; otherwise dates and times (the Azure TIMESTAMP)."""
    raw = frame[column]
    numbers = pd.to_numeric(raw, errors="coerce")
    if numbers.notna().all():
        values = numbers.to_numpy(float)
        bad = ~np.isfinite(values) | (values < 0)
        if bad.any():
            raise _bad_row(path, bad, column, frame, "arrival times must be finite seconds >= 0")
    else:
        stamps = pd.to_datetime(raw, errors="coerce", format="mixed")
        bad = stamps.isna().to_numpy()
        if bad.any():
            raise _bad_row(path, bad, column, frame, "not a time (seconds, or a date and time)")
        values = (stamps - stamps.iloc[0]).dt.total_seconds().to_numpy(float)
    back = np.diff(values) < 0
    if back.any():
        mask = np.append(False, back)
        raise _bad_row(path, mask, column, frame, "timestamps out of order (earlier than the row before); "
                       "a trace is replayed in its rows' order: sort it by time first")
    return values - values[0]


def load_trace(spec: str | Path) -> RequestTrace:
    """A bundled name or a CSV/JSONL path -> RequestTrace (as recorded; ValueError naming what is wrong)."""
    path, name, attribution = resolve(spec)
    frame = _read(path)
    if frame.empty:
        raise ValueError(f"{path}: no requests in the file (expected a header and one row per request: "
                         f"{TIME_COLUMNS[0]} or {TIME_COLUMNS[1]}, {PROMPT_COLUMNS[0]} or {PROMPT_COLUMNS[1]}, "
                         f"{OUTPUT_COLUMNS[0]} or {OUTPUT_COLUMNS[1]})")
    cols = [_column(frame, names, what, path) for names, what in
            ((TIME_COLUMNS, "arrival time"), (PROMPT_COLUMNS, "prompt length"), (OUTPUT_COLUMNS, "output length"))]
    return RequestTrace(_seconds(frame, cols[0], path), _lengths(frame, cols[1], path),
                        _lengths(frame, cols[2], path), name, attribution)
