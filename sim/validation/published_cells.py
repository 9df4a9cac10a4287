"""How a published row's cells read (sim.validation.published_rows uses these): the stack column's engine,
runtime and decode kernels (sim/engine_profiles/stacks.yaml), the source's family (sources.yaml), a dataset's
assumed mean prompt (datasets.yaml), batch and length cells as tables print them, and the row's regime."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

from kvcommon.dtypes import dtype_name

REPO_ROOT = Path(__file__).resolve().parents[2]
STACKS_FILE = REPO_ROOT / "sim" / "engine_profiles" / "stacks.yaml"
SOURCES_FILE = Path(__file__).resolve().parent / "sources.yaml"
DATASETS_FILE = Path(__file__).resolve().parent / "datasets.yaml"
# batch column words for in-flight batching at maximum load (the steady state) instead of a fixed batch
DYNAMIC_BATCH_WORDS = ("dynamic", "ifb", "inflight", "in-flight", "max", "max-load")


def _read_yaml(path: Path, what: str) -> dict:
    label = path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path.name
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} {label} not found") from None
    if not isinstance(data, dict):
        raise ValueError(f"{label}: expected a mapping")
    return data


@dataclass(frozen=True)
class Stack:
    """What a stack column says (stacks.yaml): the engine profile (None: none), its runtime class, and the
    decode-attention kernel it runs for every model or for sliding-window models, where it says."""
    engine: str | None = None
    runtime: str = "classic"
    decode_kernel: str | None = None
    sliding_window_kernel: str | None = None


@lru_cache(maxsize=None)
def stack_rules() -> tuple:
    """(pattern, Stack) rules of stacks.yaml, first match wins."""
    data = _read_yaml(STACKS_FILE, "stack rules")
    return tuple((re.compile(r["match"], re.IGNORECASE),
                  Stack(r.get("engine"), r.get("runtime", "classic"), r.get("decode_kernel"),
                        r.get("sliding_window_kernel"))) for r in data["rules"])


def classify_stack(stack: str) -> Stack:
    """The Stack of a stack column (stacks.yaml); Stack() when no rule names it."""
    for pattern, found in stack_rules():
        if pattern.search(stack):
            return found
    return Stack()


@lru_cache(maxsize=None)
def source_families() -> dict:
    return {str(k): str(v) for k, v in _read_yaml(SOURCES_FILE, "source families")["families"].items()}


@lru_cache(maxsize=None)
def ab_pairs() -> dict:
    """source -> compiled pattern of its A/B pair's baseline stack (sources.yaml `ab_pairs`)."""
    pairs = _read_yaml(SOURCES_FILE, "source families").get("ab_pairs") or {}
    return {str(k): re.compile(str(v["baseline"]), re.IGNORECASE) for k, v in pairs.items()}


@lru_cache(maxsize=None)
def dataset_prompts() -> tuple:
    data = _read_yaml(DATASETS_FILE, "dataset lengths")
    return tuple((re.compile(d["match"], re.IGNORECASE), int(d["mean_prompt_tokens"]), d["name"])
                 for d in data["datasets"])


def _dtype(text: str) -> str:
    return text.split()[0].strip().lower() if text.strip() else ""


# An integer cell as tables print it: "2,048", "1 (concurrency)", "TP8", "tp=2", "x8", "8x".
_INT_CELL = re.compile(r"^(?:tp\s*=?\s*|x\s*)?(-?\d{1,3}(?:,\d{3})+|-?\d+)(?:\s*x)?(?:\s|\(|$)", re.IGNORECASE)
# A mean length: "388.7 mean (variable)", "~483 mean", "483.0"
_MEAN_CELL = re.compile(r"^(?:~\s*(\d+(?:\.\d+)?)|(\d+(?:\.\d+)?)\s*mean\b)", re.IGNORECASE)


def _int(text: str, what: str, where: str) -> int:
    match = _INT_CELL.match(text.strip())
    if match is None:
        raise ValueError(f"{where}: {what} {text!r} is not an integer")
    return int(match.group(1).replace(",", ""))


def length_of(text: str, what: str, where: str) -> tuple[int | None, str]:
    """A prompt/gen cell: (tokens, note). Integers as _int; a mean ("388.7 mean", "~483") is rounded and taken
    as every request's length; a named dataset without a length (prompts only) takes datasets.yaml's mean;
    (None, why) for a named dataset kvsim has no length for; ValueError for anything else."""
    cell = text.strip()
    mean = _MEAN_CELL.match(cell)
    if mean is not None:
        tokens = float(mean.group(1) or mean.group(2))
        return max(int(round(tokens)), 1), f"{what} {cell!r}: the mean taken as every request's"
    if _INT_CELL.match(cell) or cell[:1].isdigit() or cell[:1] in "-+":
        return _int(cell, what, where), ""
    for pattern, tokens, name in dataset_prompts():
        if pattern.search(cell):
            if what != "prompt":
                return None, f"{what} {cell!r}: a dataset's output length is not known here"
            return tokens, f"prompt {cell!r}: {name} mean assumed {tokens} tokens (sim/validation/datasets.yaml)"
    raise ValueError(f"{where}: {what} {cell!r} is not an integer (nor a mean such as '388.7 mean')")


def batch_of(text: str, where: str) -> tuple[str, int | None, float | None, str]:
    """(batch_kind, batch, qps, note) of a batch cell (module docstring); ValueError for a cell that is none."""
    cell = text.strip()
    low = cell.lower()
    if low.startswith("qps"):
        rate = low[3:].strip().split()[0] if low[3:].strip() else ""
        if rate in ("inf", "infinite", "max"):
            return "qps", None, math.inf, ""
        try:
            return "qps", None, float(rate), ""
        except ValueError:
            raise ValueError(f"{where}: batch {cell!r}: a request rate QPS <number> or QPS INF") from None
    if low.split(" ")[0] in DYNAMIC_BATCH_WORDS and not low.startswith("max-throughput"):
        return "dynamic", None, None, ""
    if low.startswith("max-throughput") or low.startswith("max throughput"):
        return "max-static", None, None, "the largest fixed batch memory holds (batch not stated)"
    if "max_num_seqs" in low:
        return "max-seqs", _int(cell, "batch", where), None, ""
    if low.startswith(("not stated", "see notes")):
        inferred = re.search(r"\bbs\s*(\d+)", low)
        if inferred:
            return "static", int(inferred.group(1)), None, f"batch inferred from the cell's remark ({cell})"
        raise ValueError(f"{where}: the batch column does not state the batch")
    return "static", _int(cell, "batch", where), None, ""


def regime_of(metric: str, batch: int | None, prompt: int, gen: int, gqa: bool) -> str:
    """One regime per row, first match wins:
    prefill-ttft (TTFT of a prompt >= 1024, or a throughput or end-to-end row of >= 1024-token prompts and
    <= 128 generated tokens: prefill-bound; a time-per-token row is decode whatever its prompt),
    long-context (prompt + gen >= 4096), batch-1, gqa-large-batch
    (grouped-query model), large-batch-decode."""
    if (metric == "ttft_ms" and prompt >= 1024) or (metric in ("out_tok_per_s", "e2e_latency_s") and prompt >= 1024
                                                     and gen <= 128):
        return "prefill-ttft"
    if prompt + gen >= 4096:
        return "long-context"
    if batch == 1:
        return "batch-1"
    return "gqa-large-batch" if gqa else "large-batch-decode"


def _weight_dtype(cell: str, kv_cell: str) -> tuple[str, str]:
    """(dtype name, note). "mixed (as published; FP16 engine)" reads as the engine's dtype it names, else as
    the row's KV dtype; "fp8 vs fp16" (a ratio row) as fp8."""
    low = cell.strip().lower()
    if low.startswith("mixed"):
        named = re.search(r"\b(fp16|bf16|fp8)\s+engine", low)
        dtype = named.group(1) if named else _dtype(kv_cell)
        return dtype_name(dtype), f"weight dtype {cell.strip()!r} read as {dtype}"
    return dtype_name(_dtype(cell)), ""
