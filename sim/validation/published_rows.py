"""Reading published GPU measurements (vendors' tables, benchmark leaderboards) into `Row`s: the cells as
people write them, mapped onto the simulator's names, with the reason a row cannot be predicted.

A CSV has the columns source, hw, model, stack, weight_dtype, kv_dtype, tp, batch, prompt, gen, metric, value
(and notes). The default data are both training files of `../shared/data` (KVSIM_DATA): their README says
what each batch cell means, and so does `batch_of` below:

    120                               a fixed ("static") batch of 120 requests
    1 (concurrency)                   the same: N equal requests in flight
    dynamic (IFB max load; 2000 req)  in-flight batching with every request queued: the batch is set by KV
                                      capacity and the engine's limits (the steady state)
    64 (max_num_seqs; measured avg x) a saturated server capped at 64 sequences
    QPS 2 (request rate ...)          an open-loop request rate (QPS INF: all at once, the steady state)
    max-throughput batch              a fixed batch as large as memory holds (in-flight batching off)
    not stated (bs192 per ...)        the batch the cell's own remark names (bs192), noted as inferred

Lengths may be a mean ("388.7 mean (variable)", "~483") or a named dataset with no length ("LMArena prompts
(variable)"): a dataset's mean prompt is then the assumption in sim/validation/datasets.yaml, with its source,
and the row says so in its notes. The stack column picks the engine profile and its runtime
(sim/engine_profiles/stacks.yaml); the source column its family (sim/validation/sources.yaml), which the
leave-one-family-out check holds out together.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from hwmodels.skus import resolve_sku
from kvcommon.dtypes import canonical_dtype, dtype_name
from sim.model_names import resolve_name
from sim.validation.published_cells import (DATASETS_FILE, DYNAMIC_BATCH_WORDS, SOURCES_FILE, ab_pairs,  # noqa: F401
                                            STACKS_FILE, Stack, _dtype, _int, _weight_dtype, batch_of, classify_stack,
                                            dataset_prompts, length_of, regime_of, source_families, stack_rules)

REPO_ROOT = Path(__file__).resolve().parents[2]
CSV_NAME = "gpu-published-train.csv"
CSV_NAMES = ("gpu-published-train.csv", "gpu-published-train-2.csv")
COLUMNS = ("source", "hw", "model", "stack", "weight_dtype", "kv_dtype", "tp", "batch", "prompt", "gen", "metric",
           "value", "notes")
OPTIONAL_COLUMNS = ("notes",)
METRICS = ("out_tok_per_s", "ttft_ms", "e2e_latency_s", "tpot_ms", "speedup_fp8_vs_fp16")
# other spellings of the same metrics (units included: a name without its unit is not guessed). A median
# inter-token latency of a saturated server is read as its mean step time (every step of a saturated
# server with chunked prefill mixes the same share of prefill work)
METRIC_ALIASES = {"itl_ms": "tpot_ms", "median_itl_ms": "tpot_ms", "output_tok_per_s": "out_tok_per_s",
                  "out_tokens_per_s": "out_tok_per_s", "output_tokens_per_s": "out_tok_per_s"}
# metrics in another unit or per GPU, read as a METRICS one: name -> (metric, factor, times tp); the row keeps
# the published value in its notes
METRIC_CONVERSIONS = {"ttft_s": ("ttft_ms", 1e3, False), "tpot_s": ("tpot_ms", 1e3, False),
                      "avg_tpot_s": ("tpot_ms", 1e3, False),
                      "itl_s": ("tpot_ms", 1e3, False), "e2e_latency_ms": ("e2e_latency_s", 1e-3, False),
                      "out_tok_per_s_per_gpu": ("out_tok_per_s", 1.0, True),
                      "output_tok_per_s_per_gpu": ("out_tok_per_s", 1.0, True),
                      "out_tokens_per_s_per_gpu": ("out_tok_per_s", 1.0, True)}
REGIMES = ("batch-1", "large-batch-decode", "gqa-large-batch", "prefill-ttft", "long-context")
BATCH_KINDS = ("static", "dynamic", "max-seqs", "qps", "max-static")


def data_dir() -> Path:
    """KVSIM_DATA, else `../shared/data` next to the repository (never one machine's path)."""
    env = os.environ.get("KVSIM_DATA")
    return Path(env).expanduser().resolve() if env else (REPO_ROOT.parent / "shared" / "data").resolve()


def default_csv() -> Path:
    return data_dir() / CSV_NAME


def default_csvs() -> list[Path]:
    """The training files that exist (both, where ../shared/data has them)."""
    found = [data_dir() / name for name in CSV_NAMES if (data_dir() / name).is_file()]
    return found or [default_csv()]


def file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def display_path(path: Path) -> str:
    """Relative to the repository when inside it, `../...` when next to it (`../shared/data/...`), else the
    file's name alone: reports and profile files never name one machine's paths."""
    path = Path(path).resolve()
    for base, prefix in ((REPO_ROOT, Path()), (REPO_ROOT.parent, Path(".."))):
        try:
            return str(prefix / path.relative_to(base))
        except ValueError:
            continue
    return path.name


@dataclass(frozen=True)
class Row:
    index: int              # line in its CSV (1 = first data row)
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
    batch: int | None       # the fixed batch, or the cap of a max-seqs row; None: set by capacity
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
    batch_kind: str = "static"          # BATCH_KINDS
    qps: float | None = None            # batch_kind "qps": requests per second (inf: all at once)
    runtime: str = "classic"            # the stack's runtime class (stacks.yaml): classic | pytorch | vllm-v0 | vllm-v1
    decode_kernel: str | None = None    # the stack's decode-attention kernel where the stack column names it
    sliding_window_kernel: str | None = None   # ... and for sliding-window models
    family: str = "other"               # source family (sources.yaml), held out together
    csv: str = ""                       # the file's name
    # an A/B pair's row (sources.yaml ab_pairs): `value` is this row's measurement over the baseline row's,
    # predicted as the same ratio (published_gpu.predict_row)
    baseline: "Row | None" = None

    @property
    def id(self) -> str:
        b = {"static": f"b{self.batch}", "max-seqs": f"cap{self.batch}", "dynamic": "dyn", "max-static": "bmax",
             "qps": f"qps{self.qps:g}" if self.qps is not None else "qps"}[self.batch_kind]
        ratio = f"/over-row-{self.baseline.index}" if self.baseline is not None else ""
        return f"{self.source}/{self.hw}/{self.model}/{b}/{self.prompt}+{self.gen}/{self.metric}{ratio}"


def read_data_csv(path, columns, what: str) -> pd.DataFrame:
    """A measurement CSV of ../shared/data as strings: one-line errors for a missing file or missing columns
    (the published, kernel and energy files share this)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} {path} not found (set KVSIM_DATA or pass --csv)")
    table = pd.read_csv(path, dtype=str, keep_default_na=False)
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise ValueError(f"{path}: missing column(s) {', '.join(missing)}")
    return table


def _read_table(path: Path) -> pd.DataFrame:
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
    return table


def load_rows(path: Path | str | list | tuple | None = None) -> list[Row]:
    """All rows of the CSV(s) (in scope or not; default: both training files); one-line errors naming the
    file and row."""
    if path is None:
        paths = default_csvs()
    elif isinstance(path, (list, tuple)):
        paths = [Path(p) for p in path]
    else:
        paths = [Path(path)]
    rows = []
    for p in paths:
        rows.extend(_pair(_load_one(p)))
    return rows


def _pair(rows: list[Row]) -> list[Row]:
    """A/B pairs (sources.yaml ab_pairs) as ratio rows: each in-scope row of the source that is not the
    baseline, with the baseline's cells but for the stack, becomes its value over the baseline's; the baseline
    row itself goes out of scope, naming the ratio row."""
    pairs = ab_pairs()
    out = list(rows)
    for source, pattern in pairs.items():
        mine = [r for r in rows if r.source == source and r.scope == "single-device"]
        for base in (r for r in mine if pattern.search(r.stack)):
            same = ("hw", "model", "weight_dtype", "kv_dtype", "tp", "batch", "prompt", "gen", "metric", "batch_kind")
            partners = [r for r in mine if r is not base and not pattern.search(r.stack)
                        and all(getattr(r, f) == getattr(base, f) for f in same)]
            for r in partners:
                out[out.index(r)] = dataclasses.replace(
                    r, value=r.value / base.value, baseline=base,
                    notes=f"A/B pair: {r.value:g} over row {base.index}'s {base.value:g} ({base.stack}); " + r.notes)
            if partners:
                out[out.index(base)] = dataclasses.replace(
                    base, scope=f"the baseline of {source}'s A/B pair: fitted as row "
                                f"{', '.join(str(r.index) for r in partners)}'s ratio to it (sources.yaml ab_pairs)")
    return out


@dataclass
class _Cells:
    """What one row's cells read as, before the scope is decided."""
    notes: list = field(default_factory=list)
    missing: str | None = None       # the first thing kvsim lacks to predict the row

    def lack(self, why: str) -> None:
        self.missing = self.missing or why


def _load_one(path: Path) -> list[Row]:
    from sim.models import load_model
    table = _read_table(path)
    rows = []
    for i, r in enumerate(table.to_dict("records"), start=1):
        where = f"{path.name} row {i}"
        cells = _Cells()
        metric = METRIC_ALIASES.get(r["metric"].strip().lower(), r["metric"].strip().lower())
        try:
            value = float(r["value"].replace(",", "").strip())     # "8,950" as tables print it
        except ValueError:
            raise ValueError(f"{where}: value {r['value']!r} is not a number") from None
        if not value > 0:
            raise ValueError(f"{where}: value must be positive, got {value:g}")
        tp = _int(r["tp"], "tp", where)
        if r["metric"].strip().lower() == "median_itl_ms":
            cells.notes.append("median ITL read as the mean step time")
        if metric in METRIC_CONVERSIONS:
            cells.notes.append(f"published as {r['metric'].strip()} = {r['value'].strip()}")
            metric, factor, per_gpu = METRIC_CONVERSIONS[metric]
            value *= factor * (tp if per_gpu and tp > 0 else 1)
        try:
            kind, batch, qps, note = batch_of(r["batch"], where)
        except ValueError as exc:
            if "not an integer" in str(exc):
                raise
            kind, batch, qps, note = "static", None, None, ""
            cells.lack(f"batch {r['batch'].strip()!r}: {str(exc).split(': ')[-1]}")
        if note:
            cells.notes.append(note)
        lengths = {}
        for what in ("prompt", "gen"):
            n, note = length_of(r[what], what, where)
            lengths[what] = n if n is not None else 1
            if n is None:
                cells.lack(note)
            elif note:
                cells.notes.append(note)
        for what, n in (("tp", tp), ("batch", batch), ("prompt", lengths["prompt"]), ("gen", lengths["gen"])):
            if n is not None and n <= 0:
                raise ValueError(f"{where}: {what} must be a positive integer, got {n}")
        hw, hw_why = resolve_sku(r["hw"])
        resolved = resolve_name(r["model"])
        model = resolved.spec
        gqa = model is not None and load_model(model).attention != "MHA"
        weight, note = _weight_dtype(r["weight_dtype"], r["kv_dtype"])
        if note:
            cells.notes.append(note)
        kv = dtype_name(_dtype(r["kv_dtype"]))
        if metric == "speedup_fp8_vs_fp16" and kv in ("not", ""):
            kv = weight               # a ratio row that states no KV dtype: the KV in the weights' dtype
            cells.notes.append("kv dtype not stated: taken as the weights' (fp8 vs fp16)")
        for what, dtype in (("weight_dtype", weight), ("kv_dtype", kv)):
            try:
                canonical_dtype(dtype)
            except ValueError as exc:
                cells.lack(f"{exc} ({what} column)")
        stack = classify_stack(r["stack"])
        engine_name = stack.engine
        if metric not in METRICS:
            cells.lack(f"metric {r['metric'].strip()!r} is not one kvsim predicts ({', '.join(METRICS)})")
        elif kind in ("dynamic", "max-static") and metric != "out_tok_per_s":
            cells.lack(f"in-flight batching rows are predicted as out_tok_per_s only, not {metric}")
        elif kind == "qps" and metric not in ("tpot_ms", "ttft_ms"):
            cells.lack(f"request-rate rows are predicted as tpot_ms (itl) and ttft_ms, not {metric}")
        elif kind == "qps" and math.isinf(qps) and metric == "ttft_ms":
            cells.lack("the TTFT of a queue of every request at once depends on the queue, not the engine")
        if "suspect" in str(r.get("notes", "")).lower():
            cells.lack("the source's notes mark the row SUSPECT (see ../shared/data/README.md)")
        if kind == "qps" and math.isinf(qps) and metric == "tpot_ms":
            cells.lack("a burst of every request at once is a transient, not a steady state or a rate "
                       "(sim.serve --qps inf replays it)")
        if engine_name is None:
            cells.lack(f"no engine profile for stack {r['stack'].strip()!r} (TensorRT-LLM and NIM rows: trtllm, "
                       "vLLM rows: vllm; sim/engine_profiles/stacks.yaml)")
        elif hw is None:
            cells.lack(f"{r['hw'].strip()!r}: {hw_why}")
        elif model is None:
            cells.lack(resolved.reason)
        if cells.missing is not None:
            scope = cells.missing
        elif tp != 1:
            scope = f"tp={tp}: multi-GPU, not in the single-device fit (sim.validation.multigpu predicts it)"
        else:
            scope = "single-device"
        notes = "; ".join(cells.notes + ([str(r.get("notes", "")).strip()] if str(r.get("notes", "")).strip()
                                         else []))
        prompt, gen = lengths["prompt"], lengths["gen"]
        rows.append(Row(index=i, source=r["source"].strip(), hw_label=r["hw"].strip(),
                        model_label=r["model"].strip(), stack=r["stack"].strip(), engine=engine_name, hw=hw,
                        model=model, weight_dtype=weight, kv_dtype=kv, tp=tp, batch=batch, prompt=prompt, gen=gen,
                        metric=metric, value=value, regime=regime_of(metric, batch if kind == "static" else None,
                                                                     prompt, gen, gqa),
                        scope=scope, notes=notes, predictable=cells.missing is None, batch_kind=kind, qps=qps,
                        runtime=stack.runtime, decode_kernel=stack.decode_kernel,
                        sliding_window_kernel=stack.sliding_window_kernel,
                        family=source_families().get(r["source"].strip(), "other"), csv=path.name))
    return rows


def in_scope(rows: list[Row], engine_name: str | None = None) -> list[Row]:
    return [r for r in rows if r.scope == "single-device" and (engine_name is None or r.engine == engine_name)]
