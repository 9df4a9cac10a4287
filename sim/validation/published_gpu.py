"""Published GPU measurements (vendors' tables) as fit and validation rows for the engine profiles.

The CSV (default `../shared/data/gpu-published-train.csv` next to the repository, or `KVSIM_DATA`;
its README gives the sources) holds one measured number per row: source, hw, model, stack, dtypes,
tp, batch, prompt, gen, metric, value. This module maps a row onto the simulator's names, says which
rows the single-device fit covers (tp = 1; multi-GPU rows are predicted as held-out rows by
sim.validation.multigpu through sim.parallel), assigns each row one regime, and predicts its metric under
a profile.

Metrics:
  out_tok_per_s  fixed batch: batch x gen / end-to-end time of the whole batch (engine.evaluate's
                 tokens_per_s). batch "dynamic" (in-flight batching at maximum load): the steady state
                 below.
  ttft_ms        prefill of the batch, first token (engine ttft_s).
  e2e_latency_s  whole-batch end-to-end time.
  tpot_ms        mean time per output token of the fixed batch (itl_ms: the same).
Other units and per-GPU figures are converted on load (METRIC_CONVERSIONS: ttft_s, tpot_s, itl_s,
e2e_latency_ms, out_tok_per_s_per_gpu times tp), the published value kept in the row's notes.

Steady state of in-flight batching at saturation (TensorRT-LLM's trtllm-bench at infinite request
rate): the scheduler admits requests while their whole reservation fits the KV pool
(GUARANTEED_NO_EVICT, TensorRT-LLM's default capacity policy, reserves prompt + gen tokens), the pool is
KV_POOL_FRACTION of the memory left after the weights (KvCacheConfig.free_gpu_memory_fraction default
0.9), at most MAX_BATCH_SIZE requests run at once. B requests of n + T tokens then cost, per
generation of B requests, T decode steps at batch B over the mean held context n + T/2 plus B prompt
prefills packed into steps of at most MAX_NUM_TOKENS tokens.
"""
from __future__ import annotations

import hashlib
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from hwmodels.skus import resolve_sku
from kvcommon.dtypes import canonical_dtype, dtype_name
from sim import engine
from sim.model_names import resolve_name
from sim.profiles import get_profile
from sim.profiles.engines import pytorch_runtime

REPO_ROOT = Path(__file__).resolve().parents[2]
CSV_NAME = "gpu-published-train.csv"
COLUMNS = ("source", "hw", "model", "stack", "weight_dtype", "kv_dtype", "tp", "batch", "prompt", "gen", "metric",
           "value", "notes")
OPTIONAL_COLUMNS = ("notes",)
# batch column words for in-flight batching at maximum load (the steady state below) instead of a fixed batch
DYNAMIC_BATCH_WORDS = ("dynamic", "ifb", "inflight", "in-flight", "max", "max-load")
METRICS = ("out_tok_per_s", "ttft_ms", "e2e_latency_s", "tpot_ms")
# other spellings of the same metrics (units included: a name without its unit is not guessed)
METRIC_ALIASES = {"itl_ms": "tpot_ms", "output_tok_per_s": "out_tok_per_s", "out_tokens_per_s": "out_tok_per_s",
                  "output_tokens_per_s": "out_tok_per_s"}
# metrics in another unit or per GPU, read as a METRICS one: name -> (metric, factor, times tp); the row keeps
# the published value in its notes
METRIC_CONVERSIONS = {"ttft_s": ("ttft_ms", 1e3, False), "tpot_s": ("tpot_ms", 1e3, False),
                      "itl_s": ("tpot_ms", 1e3, False), "e2e_latency_ms": ("e2e_latency_s", 1e-3, False),
                      "out_tok_per_s_per_gpu": ("out_tok_per_s", 1.0, True),
                      "output_tok_per_s_per_gpu": ("out_tok_per_s", 1.0, True),
                      "out_tokens_per_s_per_gpu": ("out_tok_per_s", 1.0, True)}
REGIMES = ("batch-1", "large-batch-decode", "gqa-large-batch", "prefill-ttft", "long-context")

# Published SKU names -> hardware files: hwmodels/sku-names.yaml (hwmodels.skus; the A100 of TRT090 is taken
# to be the SXM 80 GB part, as the CSV's README says: "assumed"). HF / published model names -> shipped specs:
# sim/models/names.yaml (sim.model_names; nvidia/Llama-3.1-8B-Instruct-FP8 is llama-3.1-8b).
# TensorRT-LLM defaults for the steady state (see the module docstring), as its documentation states them
# (KvCacheConfig free_gpu_memory_fraction = 0.9, capacity_scheduler_policy GUARANTEED_NO_EVICT;
# BuildConfig max_batch_size = 2048, max_num_tokens = 8192); the project's reading of the TensorRT-LLM
# docs, not re-checked against the 1.0 release the TRT10 rows used (trtllm-bench may tune them per run).
KV_POOL_FRACTION = 0.9
MAX_BATCH_SIZE = 2048
MAX_NUM_TOKENS = 8192


def data_dir() -> Path:
    """KVSIM_DATA, else `../shared/data` next to the repository (never one machine's path)."""
    env = os.environ.get("KVSIM_DATA")
    return Path(env).expanduser().resolve() if env else (REPO_ROOT.parent / "shared" / "data").resolve()


def default_csv() -> Path:
    return data_dir() / CSV_NAME


def file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def display_path(path: Path) -> str:
    """Relative to the repository when inside it, `../...` when next to it (`../shared/data/...`), else as
    given: reports and profile files never name one machine's paths."""
    path = Path(path).resolve()
    for base, prefix in ((REPO_ROOT, Path()), (REPO_ROOT.parent, Path(".."))):
        try:
            return str(prefix / path.relative_to(base))
        except ValueError:
            continue
    return str(path)


@dataclass(frozen=True)
class Row:
    index: int              # line in the CSV (1 = first data row)
    source: str
    hw_label: str
    model_label: str
    stack: str
    engine: str | None      # the profile of its stack: "trtllm" | "vllm" (None: no profile for it)
    hw: str | None          # hardware file, None when none is shipped
    model: str | None
    weight_dtype: str
    kv_dtype: str
    tp: int
    batch: int | None       # None: in-flight batching at maximum load ("dynamic")
    prompt: int
    gen: int
    metric: str
    value: float
    regime: str
    scope: str              # "single-device" or why the row is out of scope
    notes: str = ""
    # kvsim has all it needs to predict the row (metric, dtypes, profile, hardware file, spec): only tp > 1
    # keeps such a row out of the single-device fit (sim.validation.multigpu predicts it)
    predictable: bool = True

    @property
    def runtime(self) -> str:
        """'pytorch' for TensorRT-LLM's PyTorch backend (CUDA graphs, overlap scheduler), else 'classic'."""
        return "pytorch" if self.engine == "trtllm" and "pytorch backend" in self.stack.lower() else "classic"

    @property
    def id(self) -> str:
        b = "dyn" if self.batch is None else f"b{self.batch}"
        return f"{self.source}/{self.hw}/{self.model}/{b}/{self.prompt}+{self.gen}/{self.metric}"


# The stacks each engine profile stands for (a stack column containing one of these words, case-insensitive).
# NIM runs TensorRT-LLM profiles; a stack none names (SGLang, DeepSpeed-FastGen, ...) has no profile of its own
# and its rows are not predicted under another stack's terms.
STACK_WORDS = ((r"\bvllm\b", "vllm"), (r"\btensorrt", "trtllm"), (r"\btrt-?llm\b", "trtllm"), (r"\bnim\b", "trtllm"))


def _engine(stack: str) -> str | None:
    """The profile of the stack that ran (STACK_WORDS), None when no profile stands for it."""
    text = stack.lower()
    return next((engine_name for word, engine_name in STACK_WORDS if re.search(word, text)), None)


def _dtype(text: str) -> str:
    return text.split()[0].strip().lower() if text.strip() else ""


# An integer cell as tables print it: "2,048", "1 (concurrency)", "TP8", "tp=2", "x8", "8x".
_INT_CELL = re.compile(r"^(?:tp\s*=?\s*|x\s*)?(-?\d{1,3}(?:,\d{3})+|-?\d+)(?:\s*x)?(?:\s|\(|$)", re.IGNORECASE)


def _int(text: str, what: str, where: str) -> int:
    match = _INT_CELL.match(text.strip())
    if match is None:
        raise ValueError(f"{where}: {what} {text!r} is not an integer")
    return int(match.group(1).replace(",", ""))


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


def load_rows(path: Path | str | None = None) -> list[Row]:
    """All rows of the CSV (in scope or not); one-line errors naming the file and row."""
    path = Path(path) if path is not None else default_csv()
    if not path.is_file():
        raise FileNotFoundError(f"published GPU measurements {path} not found (set KVSIM_DATA or pass --csv)")
    try:
        table = pd.read_csv(path, dtype=str, keep_default_na=False, encoding="utf-8-sig")   # a spreadsheet's BOM
    except pd.errors.EmptyDataError:
        raise ValueError(f"{path}: empty file (no header row; columns: {', '.join(COLUMNS)})") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not a readable CSV ({str(exc).splitlines()[0]})") from None
    # headers as people type them: "Weight dtype", " KV_dtype", "TP" are weight_dtype, kv_dtype, tp
    table.columns = [re.sub(r"[\s-]+", "_", str(c).strip().lower()) for c in table.columns]
    missing = [c for c in COLUMNS if c not in table.columns and c not in OPTIONAL_COLUMNS]
    if missing:
        raise ValueError(f"{path}: missing columns {missing}")
    if not len(table):
        raise ValueError(f"{path}: no rows")
    from sim.models import load_model
    rows = []
    for i, r in enumerate(table.to_dict("records"), start=1):
        where = f"{path.name} row {i}"
        metric = METRIC_ALIASES.get(r["metric"].strip().lower(), r["metric"].strip().lower())
        try:
            value = float(r["value"].replace(",", "").strip())     # "8,950" as tables print it
        except ValueError:
            raise ValueError(f"{where}: value {r['value']!r} is not a number") from None
        if not value > 0:
            raise ValueError(f"{where}: value must be positive, got {value:g}")
        tp = _int(r["tp"], "tp", where)
        notes = str(r.get("notes", "")).strip()
        if metric in METRIC_CONVERSIONS:
            published = f"published as {r['metric'].strip()} = {r['value'].strip()}"
            metric, factor, per_gpu = METRIC_CONVERSIONS[metric]
            value *= factor * (tp if per_gpu and tp > 0 else 1)
            notes = f"{published}; {notes}" if notes else published
        dynamic = r["batch"].strip().lower().split(" ")[0] in DYNAMIC_BATCH_WORDS
        batch = None if dynamic else _int(r["batch"], "batch", where)
        prompt, gen = _int(r["prompt"], "prompt", where), _int(r["gen"], "gen", where)
        for what, n in (("tp", tp), ("batch", batch), ("prompt", prompt), ("gen", gen)):
            if n is not None and n <= 0:
                raise ValueError(f"{where}: {what} must be a positive integer, got {n}")
        hw, hw_why = resolve_sku(r["hw"])
        resolved = resolve_name(r["model"])
        model = resolved.spec
        gqa = model is not None and load_model(model).attention != "MHA"
        dtypes, bad_dtype = {}, None
        for what in ("weight_dtype", "kv_dtype"):
            dtypes[what] = dtype_name(_dtype(r[what]))
            try:
                canonical_dtype(dtypes[what])
            except ValueError as exc:
                bad_dtype = bad_dtype or f"{exc} ({what} column)"
        engine_name = _engine(r["stack"])
        missing = None                      # the first thing kvsim lacks to predict the row
        if metric not in METRICS:
            missing = f"metric {r['metric'].strip()!r} is not one kvsim predicts ({', '.join(METRICS)})"
        elif batch is None and metric != "out_tok_per_s":
            missing = f"in-flight batching rows are predicted as out_tok_per_s only, not {metric}"
        elif bad_dtype:
            missing = bad_dtype
        elif engine_name is None:
            missing = (f"no engine profile for stack {r['stack'].strip()!r} (TensorRT-LLM and NIM rows: trtllm, vLLM "
                       "rows: vllm)")
        elif hw is None:
            missing = f"{r['hw'].strip()!r}: {hw_why}"
        elif model is None:
            missing = resolved.reason
        if missing is not None:
            scope = missing
        elif tp != 1:
            scope = f"tp={tp}: multi-GPU, not in the single-device fit (sim.validation.multigpu predicts it)"
        else:
            scope = "single-device"
        rows.append(Row(index=i, source=r["source"].strip(), hw_label=r["hw"].strip(), model_label=r["model"].strip(),
                        stack=r["stack"].strip(), engine=engine_name, hw=hw, model=model,
                        weight_dtype=dtypes["weight_dtype"], kv_dtype=dtypes["kv_dtype"], tp=tp, batch=batch,
                        prompt=prompt, gen=gen, metric=metric, value=value,
                        regime=regime_of(metric, batch, prompt, gen, gqa), scope=scope,
                        notes=notes, predictable=missing is None))
    return rows


def in_scope(rows: list[Row], engine_name: str | None = None) -> list[Row]:
    return [r for r in rows if r.scope == "single-device" and (engine_name is None or r.engine == engine_name)]


# ---------------------------------------------------------------------------------------------------
# Predictions

def _static(row: Row, profile) -> float:
    out = engine.evaluate(row.hw, row.model, "full", batch=row.batch, prompt=row.prompt, gen=row.gen,
                          kv_dtype=row.kv_dtype, weight_dtype=row.weight_dtype, profile=profile, with_capacity=False)
    if row.metric == "ttft_ms":
        return float(out["ttft_s"][0]) * 1e3
    if row.metric == "e2e_latency_s":
        return float(out["e2e_s"][0])
    if row.metric == "tpot_ms":
        return float(out["tpot_s"][0]) * 1e3
    return float(out["tokens_per_s"][0])


def steady_state_batch(row: Row) -> int:
    """Requests in flight at saturation: the KV pool over each request's reservation (prompt + gen). With
    tensor parallelism (row.tp devices) the pool is the devices' memory less the weights, and each KV head
    is stored as often as the TP group replicates it (fewer KV heads than ranks)."""
    from sim.models import load_model
    from sim.parallel.shard import kv_replication
    m = load_model(row.model)
    device = engine.resolve_device(row.hw)
    pool = KV_POOL_FRACTION * (row.tp * float(device.memory_bytes) - m.weight_bytes(row.weight_dtype))
    per_request = m.kv_bytes_per_token(row.kv_dtype) * kv_replication(m.n_kv_heads, row.tp) * (row.prompt + row.gen)
    return int(max(min(MAX_BATCH_SIZE, math.floor(pool / per_request)), 1))


def _prefill_per_request(row: Row, profile) -> float:
    """Prefill time per request with prompts packed into steps of at most MAX_NUM_TOKENS tokens."""
    kw = dict(weight_dtype=row.weight_dtype, kv_dtype=row.kv_dtype, policy="full", profile=profile)
    n = row.prompt
    if n <= MAX_NUM_TOKENS:
        per_step = max(MAX_NUM_TOKENS // n, 1)
        return engine.prefill_time(row.hw, row.model, [(n, 0)] * per_step, **kw) / per_step
    total, done = 0.0, 0
    while done < n:
        chunk = min(MAX_NUM_TOKENS, n - done)
        total += engine.prefill_time(row.hw, row.model, [(chunk, done, done + chunk >= n)], **kw)
        done += chunk
    return total


def _dynamic(row: Row, profile) -> float:
    b = steady_state_batch(row)
    decode = engine.decode_step_time(row.hw, row.model, np.full(b, row.prompt + row.gen / 2.0),
                                     weight_dtype=row.weight_dtype, kv_dtype=row.kv_dtype, policy="full",
                                     profile=profile)
    period = row.gen * decode + b * _prefill_per_request(row, profile)
    if row.metric != "out_tok_per_s":
        raise ValueError(f"row {row.index}: in-flight batching rows support out_tok_per_s only")
    return b * row.gen / period


def runtime_profile(runtime: str, profile):
    """`profile` (a name or a Profile) as the row's runtime runs it: under TensorRT-LLM's PyTorch backend
    (Row.runtime "pytorch") an engine profile hides launches and host work; fused and the eager profiles,
    and every profile under the classic runtime, as named."""
    if runtime != "pytorch":
        return profile
    resolved = get_profile(profile)
    return pytorch_runtime(resolved) if resolved.launch_overhead_s is not None else profile


def predict_row(row: Row, profile) -> float:
    """The simulator's value of the row's metric under `profile` (a name or a Profile), run under the row's
    runtime (runtime_profile)."""
    if row.scope != "single-device":
        raise ValueError(f"row {row.index} ({row.id}) is out of scope: {row.scope}")
    profile = runtime_profile(row.runtime, profile)
    return _dynamic(row, profile) if row.batch is None else _static(row, profile)


def error_pct(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured * 100.0
