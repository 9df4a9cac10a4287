"""`python -m sim.sweep`: evaluate a grid of design points and write a table, plots and a summary.

    python -m sim.sweep                                  # embedded defaults (datasheet devices x 4 models x ...)
    python -m sim.sweep --hw h100-sxm,l4 --models llama-3-8b --cache-ratios 0.2,0.5,1 --out results/mine
    python -m sim.sweep --config grid.yaml               # same keys as GridConfig; flags override the file
    python -m sim.sweep --workers 2                      # local worker processes
    python -m sim.sweep --scheduler tcp://host:8786      # a Dask distributed cluster
    python -m sim.sweep --engine des --qps 4             # the discrete-event serving simulator per point

Three pure steps, so sim.runner can chunk, spread and cache the middle one:
    build_grid(config) -> DataFrame of inputs (one row per point)
    evaluate(points)   -> DataFrame of outputs, one row per input row, same order
    write_outputs(table, out_dir)

Every point's result is cached (`--cache-dir`, default .cache/sweep) under a hash of its whole
configuration (device file content, model spec, policy, trace content, code version): a rerun reuses
it, and an interrupted sweep resumes where it stopped. Besides the formula-driven grid, the sweep
predicts every policy x cache ratio of the bundled traces (`traces/data/`, real models) from their
measured KV lengths and joins each with its measured quality (`tradeoff.parquet`, `pareto_*.png`).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd

from hwmodels.dtypes import canonical_dtype
from sim import engine, runner
from sim.cli import ArgumentParser, atomic_write_text, atomic_writer, csv_list, positive_int, run
from sim.kvlen import POLICIES
from sim.models import load_model

DEFAULT_MODELS = ["llama-2-7b", "llama-3-8b", "mpt-7b", "gpt-j-6b"]
DEFAULT_RATIOS = [round(0.1 * i, 1) for i in range(1, 11)]


def datasheet_devices() -> list[str]:
    """Every shipped device except measured local ones (cpu-*)."""
    from hwmodels import list_devices
    return [name for name in list_devices() if not name.startswith("cpu")]


@dataclass
class GridConfig:
    """Axes of a cartesian grid; every list must be non-empty. YAML files use the same keys."""
    hw: list = field(default_factory=datasheet_devices)
    models: list = field(default_factory=lambda: list(DEFAULT_MODELS))
    policies: list = field(default_factory=lambda: list(POLICIES))
    cache_ratios: list = field(default_factory=lambda: list(DEFAULT_RATIOS))
    batches: list = field(default_factory=lambda: [1, 8, 32, 128])
    prompts: list = field(default_factory=lambda: [1024, 4096])
    gens: list = field(default_factory=lambda: [256, 1024])
    recent_ratios: list = field(default_factory=lambda: [0.3])
    beams: list = field(default_factory=lambda: [1])
    kv_dtypes: list = field(default_factory=lambda: ["bf16"])
    weight_dtypes: list = field(default_factory=lambda: ["bf16"])
    profiles: list = field(default_factory=lambda: ["fused"])

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, (str, int, float)):
                value = [value]
                setattr(self, f.name, value)
            if not isinstance(value, list) or not value:
                raise ValueError(f"grid {f.name}: expected a non-empty list, got {value!r}")
        for name in ("batches", "prompts", "gens", "beams"):
            for v in getattr(self, name):
                if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                    raise ValueError(f"grid {name}: expected positive integers, got {v!r}")
        for name, lo_open in (("cache_ratios", True), ("recent_ratios", False)):
            for v in getattr(self, name):
                if isinstance(v, bool) or not isinstance(v, (int, float)):   # e.g. a list inside the list
                    raise ValueError(f"grid {name}: expected numbers in {'(0, 1]' if lo_open else '[0, 1]'}, got {v!r}")
                in_range = 0 < v <= 1 if lo_open else 0 <= v <= 1
                if not in_range:
                    raise ValueError(f"grid {name}: {v!r} out of range {'(0, 1]' if lo_open else '[0, 1]'}")
        for v in self.policies:
            if not isinstance(v, str) or v not in POLICIES:
                raise ValueError(f"grid policies: unknown policy {v!r}; expected {', '.join(POLICIES)}")
        for name in ("hw", "models", "policies", "kv_dtypes", "weight_dtypes", "profiles"):
            bad = [v for v in getattr(self, name) if not isinstance(v, (str, os.PathLike))]
            if bad:
                raise ValueError(f"grid {name}: expected names, got {bad[0]!r}")
        self.hw = [str(v) for v in self.hw]
        self.models = [str(v) for v in self.models]
        self.kv_dtypes = [canonical_dtype(v) for v in self.kv_dtypes]
        self.weight_dtypes = [canonical_dtype(v) for v in self.weight_dtypes]

    @classmethod
    def from_yaml(cls, path) -> "GridConfig":
        return load_config(path)[0]


def _read_yaml(path) -> dict:
    import yaml
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config {path} not found")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ValueError(f"config {path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ValueError(f"config {path}: expected a mapping of grid axes")
    return data


def load_config(path) -> tuple["GridConfig", "RunOptions"]:
    """A YAML file holds grid axes (GridConfig keys) and, optionally, how to run them (RunOptions keys:
    workers, scheduler, cache_dir, engine, traces, trace_*, qps, requests)."""
    data = _read_yaml(path)
    if "devices" in data and "hw" not in data:
        data["hw"] = data.pop("devices")
    grid_keys = {f.name for f in fields(GridConfig)}
    run_keys = {f.name for f in fields(RunOptions)}
    unknown = sorted(set(data) - grid_keys - run_keys)
    if unknown:
        raise ValueError(f"config {path}: unknown key {unknown[0]!r}; expected {', '.join(sorted(grid_keys | run_keys))}")
    try:
        grid = GridConfig(**{k: v for k, v in data.items() if k in grid_keys})
        options = RunOptions(**{k: v for k, v in data.items() if k in run_keys})
    except (ValueError, TypeError) as exc:
        raise ValueError(f"config {path}: {exc}") from None
    return grid, options


ENGINES = ("analytic", "des")
OWN = "own"      # trace_models / trace_prompts / trace_gens: the trace's own model or lengths


def _own_or_positive(values, name):
    out = []
    for v in values:
        if v == OWN:
            out.append(OWN)
        elif isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name}: expected '{OWN}' or positive integers, got {v!r}")
        else:
            out.append(int(v))
    return out


@dataclass
class RunOptions:
    """How to run a sweep (not what it contains): where, with which cache, with which engine, and
    which traces feed its trace-driven points. YAML files may hold these keys beside the grid axes."""
    workers: int = 1                      # > 1: that many local worker processes
    scheduler: str | None = None          # a Dask scheduler address: run the points on that cluster
    cache_dir: str | None = ".cache/sweep"   # None: no per-point cache
    engine: str = "analytic"              # analytic (sim.engine) | des (sim.serve, one serving run per point)
    traces: list = field(default_factory=lambda: ["bundled"])   # folders, "bundled", or [] / "none"
    trace_models: list = field(default_factory=lambda: [OWN])
    trace_prompts: list = field(default_factory=lambda: [OWN])
    trace_gens: list = field(default_factory=lambda: [OWN])
    trace_batches: list = field(default_factory=lambda: [1])
    qps: float = math.inf                 # des: request rate (inf: all requests at t=0)
    requests: int = 64                    # des: requests per serving run

    def __post_init__(self):
        if isinstance(self.workers, bool) or not isinstance(self.workers, (int, np.integer)) or self.workers < 1:
            raise ValueError(f"workers must be a positive integer, got {self.workers!r}")
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        for name in ("traces", "trace_models", "trace_prompts", "trace_gens", "trace_batches"):
            value = getattr(self, name)
            if isinstance(value, (str, int)):
                setattr(self, name, [value])
        if self.traces in (["none"], [None]):
            self.traces = []
        self.trace_prompts = _own_or_positive(self.trace_prompts, "trace_prompts")
        self.trace_gens = _own_or_positive(self.trace_gens, "trace_gens")
        self.trace_batches = _own_or_positive(self.trace_batches, "trace_batches")
        if OWN in self.trace_batches:
            raise ValueError("trace_batches: expected positive integers")
        if isinstance(self.qps, bool) or not isinstance(self.qps, (int, float, str)):
            raise ValueError(f"qps must be one number > 0 (or inf), got {self.qps!r}")
        try:
            self.qps = float(self.qps)
        except ValueError:
            raise ValueError(f"qps must be one number > 0 (or inf), got {self.qps!r}") from None
        if not self.qps > 0:
            raise ValueError(f"qps must be > 0 (or inf), got {self.qps}")
        if isinstance(self.requests, bool) or not isinstance(self.requests, (int, np.integer)) or self.requests < 1:
            raise ValueError(f"requests must be a positive integer, got {self.requests!r}")

    def trace_dirs(self) -> list[Path]:
        from sim import traced
        dirs = []
        for entry in self.traces:
            if entry == "bundled":
                dirs += traced.bundled_traces()
            else:
                path = Path(entry)
                if not (path / "manifest.json").is_file():
                    raise FileNotFoundError(f"trace folder {path} not found (no manifest.json)")
                dirs.append(path)
        return list(dict.fromkeys(p.resolve() for p in dirs))


INPUT_COLUMNS = ["hw", "model", "policy", "cache_ratio", "recent_ratio", "batch", "beams", "prompt", "gen",
                 "kv_dtype", "weight_dtype", "profile"]
GROUP_COLUMNS = ["hw", "model", "policy", "profile"]   # the engine vectorises over everything else


def _model_hash(spec) -> str:
    return hashlib.sha256(json.dumps(spec.to_dict(), sort_keys=True).encode()).hexdigest()[:16]


def build_grid(config: GridConfig) -> pd.DataFrame:
    """Cartesian product of the axes; validates every device, model and profile name first.

    `hw_hash` and `model_hash` identify the device file and model spec content (result caching)."""
    from hwmodels import load_device
    from sim.profiles import get_profile
    devices = {name: load_device(name) for name in config.hw}
    specs = {name: load_model(name) for name in config.models}
    for name in config.profiles:
        get_profile(name)
    axes = [config.hw, config.models, config.policies, config.cache_ratios, config.recent_ratios, config.batches,
            config.beams, config.prompts, config.gens, config.kv_dtypes, config.weight_dtypes, config.profiles]
    # MultiIndex.from_product builds the product in numpy (about 1 s per 2 million points); a Python
    # itertools.product of tuples would take ten times longer and memory for 10^7-point grids.
    df = pd.MultiIndex.from_product(axes, names=INPUT_COLUMNS).to_frame(index=False)
    # cells keep the user's spelling (a name or a file path), so evaluate() can load them anywhere
    df["hw_hash"] = df["hw"].map({n: d.content_hash for n, d in devices.items()})
    df["model_hash"] = df["model"].map({n: _model_hash(s) for n, s in specs.items()})
    return df


OUTPUT_COLUMNS = ["ttft_s", "tpot_s", "e2e_s", "tokens_per_s", "peak_memory_bytes", "fits", "max_batch",
                  "max_batch_tokens_per_s", "max_batch_tpot_s", "max_batch_all_at_once",
                  "max_batch_all_at_once_tokens_per_s", "decode_bound", "decode_kv_read_bytes",
                  "decode_memory_time_s", "decode_compute_time_s", "kv_bytes_per_token", "peak_kv_tokens",
                  "weight_bytes", "device_memory_bytes", "exceeds_max_positions"]


def _names(values: np.ndarray):
    """One name when all points share it (the engine's scalar fast path), else the array of names."""
    return values[0] if (values == values[0]).all() else values


def evaluate(points: pd.DataFrame, progress: bool = False) -> pd.DataFrame:
    """Outputs for each row of `points` (same order, fresh RangeIndex). Pure: chunks evaluate alike.

    `hw` and `model` cells are names or file paths; only INPUT_COLUMNS are read."""
    from hwmodels import load_device
    from tqdm import tqdm
    points = points.reset_index(drop=True)
    kinds = {"fits": bool, "max_batch": np.int64, "max_batch_all_at_once": np.int64, "decode_bound": object,
             "exceeds_max_positions": bool}
    out = {c: np.empty(len(points), dtype=kinds.get(c, float)) for c in OUTPUT_COLUMNS}
    devices, specs = {}, {}
    groups = points.groupby(GROUP_COLUMNS, sort=False).indices
    # plain numpy columns, indexed per group (much cheaper than slicing the DataFrame per group)
    cols = {c: points[c].to_numpy() for c in ("batch", "prompt", "gen", "cache_ratio", "recent_ratio", "beams",
                                              "kv_dtype", "weight_dtype")}
    # disable=None: the bar shows on a terminal only, never in logs
    for key, idx in tqdm(groups.items(), desc="sweep", unit="group", disable=None if progress else True,
                         file=sys.stderr):
        hw_name, model_name, policy, profile = key
        if hw_name not in devices:
            devices[hw_name] = load_device(hw_name)
        if model_name not in specs:
            specs[model_name] = load_model(model_name)
        hw, spec = devices[hw_name], specs[model_name]
        g = {c: v[idx] for c, v in cols.items()}
        r = engine.evaluate(hw, spec, policy, batch=g["batch"], prompt=g["prompt"], gen=g["gen"],
                            cache_ratio=g["cache_ratio"], recent_ratio=g["recent_ratio"], beams=g["beams"],
                            kv_dtype=_names(g["kv_dtype"]), weight_dtype=_names(g["weight_dtype"]), profile=profile)
        r["device_memory_bytes"] = np.full(len(idx), float(hw.memory_bytes))
        total = g["prompt"] + g["gen"]
        r["exceeds_max_positions"] = total > spec.max_positions if spec.max_positions else np.zeros(len(idx), bool)
        for col in OUTPUT_COLUMNS:
            out[col][idx] = r[col]
    return pd.DataFrame(out, index=points.index)


def _write_points(table: pd.DataFrame, out_dir: Path, csv: bool = False) -> list[Path]:
    """points.parquet (and points.csv with `csv`: ~9 MB for the default grid, most of the output time) under
    out_dir (created if missing), each written atomically; both sweep engines write their table this way."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, write in (("points.parquet", lambda p: table.to_parquet(p, index=False)),
                        ("points.csv", lambda p: table.to_csv(p, index=False))):
        if name.endswith(".csv") and not csv:
            (out_dir / name).unlink(missing_ok=True)    # never a stale CSV beside a new Parquet table
            continue
        atomic_writer(out_dir / name, write)
        written.append(out_dir / name)
    return written


def write_outputs(table: pd.DataFrame, out_dir, meta: dict | None = None, csv: bool = False) -> list[Path]:
    """points.parquet (+ points.csv with `csv`), PNG plots and summary.md under out_dir (each atomically)."""
    from sim import plots
    out_dir = Path(out_dir)
    written = _write_points(table, out_dir, csv)
    written += plots.sweep_plots(table, out_dir)
    atomic_write_text(out_dir / "summary.md", summary_markdown(table, meta or {}))
    written.append(out_dir / "summary.md")
    return written


def _md_table(df: pd.DataFrame) -> str:
    head = "| " + " | ".join(df.columns) + " |\n|" + "---|" * len(df.columns) + "\n"
    return head + "".join("| " + " | ".join(str(v) for v in row) + " |\n" for row in df.itertuples(index=False))


# The summary's headline comparisons: each evicting policy at the cache ratio where, in the Keyformer paper
# (Adnan et al., MLSys 2024, Table 1 / Figure 9), it keeps about the accuracy of full attention: Keyformer
# at 50% of the KV cache, H2O only at 90%. Comparing both at one ratio would credit H2O with a speedup at a
# budget where it loses accuracy; the summary prints this reason under each table.
HEADLINE_BUDGETS = (
    ("keyformer", 0.5, "Keyformer at 50% of the KV cache: the budget at which the Keyformer paper (Table 1) "
                       "keeps about full-attention accuracy"),
    ("h2o", 0.9, "H2O at 90%: the budget the Keyformer paper (Table 1) needs for H2O to reach about the same "
                 "accuracy as Keyformer at 50%, i.e. an iso-accuracy comparison, not an iso-budget one"),
)
FITS_ONLY_WITH_EVICTION = "fits only with eviction"


def _gain(ev: pd.Series, full: pd.Series) -> list:
    """Throughput gain at each one's largest batch; words where a ratio has no meaning (full fits 0)."""
    out = []
    for e, f in zip(ev, full):
        if f > 0:
            out.append(round(float(e / f), 2))
        else:
            out.append(FITS_ONLY_WITH_EVICTION if e > 0 else "fits neither")
    return out


def headline(table: pd.DataFrame, policy: str = "keyformer", ratio: float = 0.5) -> pd.DataFrame:
    """Per device x model at the longest context, batch 1: `policy` at `ratio` against full attention
    (TPOT speedup at the same batch; tokens/s at each one's largest batch)."""
    t = table[(table["prompt"] == table["prompt"].max()) & (table["gen"] == table["gen"].max())
              & (table["beams"] == table["beams"].min())]
    b1 = t[t["batch"] == t["batch"].min()]
    full = b1[b1["policy"] == "full"].groupby(["hw", "model"]).first()
    ratios = b1.loc[b1["policy"] == policy, "cache_ratio"]
    if full.empty or ratios.empty:
        return pd.DataFrame()
    near = ratios.iloc[(ratios - ratio).abs().argsort().iloc[0]]
    ev = b1[(b1["policy"] == policy) & (b1["cache_ratio"] == near)].groupby(["hw", "model"]).first()
    j = full.reset_index().merge(ev.reset_index(), on=["hw", "model"], suffixes=("_full", "_ev"))
    return pd.DataFrame({
        "device": j["hw"], "model": j["model"],
        "TPOT full (ms)": (1e3 * j["tpot_s_full"]).round(2),
        f"TPOT {policy}@{near:g} (ms)": (1e3 * j["tpot_s_ev"]).round(2),
        "speedup": (j["tpot_s_full"] / j["tpot_s_ev"]).round(2),
        "max batch full": j["max_batch_full"], f"max batch {policy}": j["max_batch_ev"],
        "tok/s @max batch full": j["max_batch_tokens_per_s_full"].round(0).astype(int),
        f"tok/s @max batch {policy}": j["max_batch_tokens_per_s_ev"].round(0).astype(int),
        "throughput gain": _gain(j["max_batch_tokens_per_s_ev"], j["max_batch_tokens_per_s_full"]),
        "beyond context": _beyond(j),
    })


def _beyond(j: pd.DataFrame) -> list[str]:
    """'yes (trained N)' where prompt + gen exceeds the model's trained context (a what-if row), else 'no'."""
    from sim.models import load_model
    out = []
    for model, over in zip(j["model"], j.get("exceeds_max_positions_full", pd.Series(False, index=j.index))):
        if not bool(over):
            out.append("no")
            continue
        try:
            limit = load_model(model).max_positions
        except (ValueError, FileNotFoundError):
            limit = None
        out.append(f"yes (trained {limit})" if limit else "yes")
    return out


def context_lines(table: pd.DataFrame) -> list[str]:
    """One note per (prompt, gen) slice whose points lie beyond some model's trained context."""
    if "exceeds_max_positions" not in table.columns or not table["exceeds_max_positions"].any():
        return []
    lines = []
    over = table[table["exceeds_max_positions"]]
    for (prompt, gen), g in over.groupby(["prompt", "gen"]):
        models = ", ".join(sorted(g["model"].unique()))
        lines.append(f"- prompt {prompt} + gen {gen} lies beyond the trained context of {models} "
                     f"({len(g):,} points): what-if rows, marked in the headline tables and plot titles.")
    return lines


def summary_markdown(table: pd.DataFrame, meta: dict) -> str:
    axes = {c: sorted(table[c].unique().tolist()) for c in INPUT_COLUMNS}
    lines = ["# kvsim sweep", "",
             f"{len(table):,} design points, evaluated in {meta.get('eval_s', float('nan')):.2f} s "
             f"({meta.get('points_per_s', float('nan')):,.0f} points/s) with the analytic engine (sim.engine).", "",
             "## Grid", ""]
    lines += [f"- **{c}**: {', '.join(str(v) for v in vals)}" for c, vals in axes.items()]
    lines += ["", "Full attention ignores the cache ratio (its rows repeat across ratios as the reference).",
              "TPOT = mean decode-step time over gen-1 steps; throughput counts batch x gen tokens / end-to-end time.",
              ""]
    # the headline: what each policy x budget costs in measured quality and buys in predicted speed
    lines += meta.get("tradeoff_md", [])
    lines += ["## What a smaller cache buys (formula-driven grid)", ""]
    for policy, ratio, why in HEADLINE_BUDGETS:
        h = headline(table, policy, ratio)
        if not h.empty:
            p0, g0 = table["prompt"].max(), table["gen"].max()
            title = f"### {policy} vs full, prompt {p0} + gen {g0}, batch {table['batch'].min()}"
            lines += [title, "", f"Why this ratio: {why}.", "", _md_table(h), ""]
            if (h["throughput gain"] == FITS_ONLY_WITH_EVICTION).any():
                lines += [f"\"{FITS_ONLY_WITH_EVICTION}\": full attention does not fit one request at this "
                          "context (max batch 0); the evicting policy does, so no ratio exists.", ""]
    lines += _execution_markdown(meta)
    fits = table["fits"].mean()
    lines += ["## Notes", "",
              f"- {100 * (1 - fits):.1f}% of points do not fit in device memory at their batch (column `fits`).",
              f"- {int(table['exceeds_max_positions'].sum()):,} points exceed the model's trained context "
              "(`exceeds_max_positions`); they are kept as what-if rows.",
              *context_lines(table),
              "- Plots: latency_vs_cache_ratio.png, throughput_vs_batch.png, max_batch_throughput_vs_cache_ratio.png.",
              ""]
    return "\n".join(lines)


def _execution_markdown(meta: dict) -> list[str]:
    if not meta.get("execution"):
        return []
    return (["## Execution", ""] + [f"- {line}" for line in meta["execution"]]
            + [f"- code version {meta.get('code_version', '?')} (hash of the sim, hwmodels and traces sources; "
               "part of every cache key)", ""])


DES_SUMMARY_COLUMNS = ["tokens_per_s", "ttft_s_p50", "ttft_s_p99", "tpot_s_p50", "tpot_s_p99", "completed",
                       "preemptions"]


def write_des_outputs(table: pd.DataFrame, out_dir, meta: dict, csv: bool = False) -> list[Path]:
    """The DES sweep's table and a summary (its columns are serving metrics, so no roofline plots)."""
    out_dir = Path(out_dir)
    written = _write_points(table, out_dir, csv)
    shown = [c for c in DES_SUMMARY_COLUMNS if c in table.columns]
    failed = table["des_error"].astype(str).str.len().gt(0) if "des_error" in table.columns else pd.Series(False, index=table.index)
    lines = ["# kvsim sweep (discrete-event serving simulation)", "",
             f"{len(table):,} design points; each is one `sim.serve` run of {int(table['requests'].iloc[0])} requests "
             f"at {table['qps'].iloc[0]:g} requests/s with at most `batch` in flight.", ""]
    lines += _execution_markdown(meta)
    if shown and (~failed).any():
        view = table[~failed].groupby(["hw", "model", "policy", "cache_ratio"], as_index=False)[shown].mean()
        lines += ["## Mean over the other axes", "", _md_table(view.round(4)), ""]
    if failed.any():
        lines += [f"{int(failed.sum())} points could not run (column `des_error`), e.g.: "
                  f"{table.loc[failed, 'des_error'].iloc[0]}", ""]
    lines += meta.get("tradeoff_md", [])
    atomic_write_text(out_dir / "summary.md", "\n".join(lines))
    written.append(out_dir / "summary.md")
    return written


# ----------------------------------------------------------------------------------------------------
# Cache keys, the DES engine, and running the phases through sim.runner

def cache_key_columns(points: pd.DataFrame) -> list[str]:
    """What identifies a point's result: every input but the device and model *names* (their content
    hashes stand in, so editing a device file recomputes exactly its points, and a renamed copy
    reuses them), the trace's content hash (not its path) and, for the DES, the load it serves."""
    names = {"hw", "model", "trace", "trace_path", "trace_model"}
    extra = ["hw_hash", "model_hash", "policy_label", "trace_hash", "qps", "requests"]
    return [c for c in INPUT_COLUMNS if c not in names] + [c for c in extra if c in points.columns]


def evaluate_des(points: pd.DataFrame) -> pd.DataFrame:
    """One discrete-event serving run (sim.serve.simulate) per point: `requests` requests arriving at
    `qps`, at most `batch` in flight, KV lengths from the point's trace when it has one. A point
    that cannot run (the model does not fit) gets NaN results and its reason in `des_error`."""
    from sim import serve, traced
    rows = []
    for point in points.reset_index(drop=True).to_dict("records"):
        model = traced.resolve_model(point["model"]) if str(point["model"]).startswith(traced.TRACE_MODEL_PREFIX) \
            else point["model"]
        options = dict(recent_ratio=point["recent_ratio"], prompt=int(point["prompt"]), gen=int(point["gen"]),
                       kv_dtype=point["kv_dtype"], weight_dtype=point["weight_dtype"], profile=point["profile"],
                       max_batch=int(point["batch"]), qps=float(point["qps"]), requests=int(point["requests"]))
        if isinstance(point.get("trace_path"), str):
            options["trace"] = point["trace_path"]
        try:
            rows.append({**serve.simulate(point["hw"], model, point["policy"], point["cache_ratio"], **options).to_row(),
                         "des_error": ""})
        except ValueError as exc:
            rows.append({"des_error": str(exc).splitlines()[0]})
    return pd.DataFrame(rows)


@dataclass
class Phase:
    """One group of points run through sim.runner, and what came out."""
    name: str
    points: pd.DataFrame
    result: runner.RunResult | None = None

    @property
    def table(self) -> pd.DataFrame:
        return pd.concat([self.points.reset_index(drop=True), self.result.table], axis=1)


def run_phase(name: str, points: pd.DataFrame, evaluate_fn, options: RunOptions, executor) -> Phase:
    context = {"engine": options.engine}
    if options.engine == "des":
        points = points.assign(qps=options.qps, requests=options.requests)
    phase = Phase(name, points)
    phase.result = runner.run_points(points, evaluate_fn, key_columns=cache_key_columns(points), context=context,
                                     cache_dir=options.cache_dir, executor=executor, desc=name,
                                     # the grid evaluate reads only the inputs: ship just those to workers
                                     eval_columns=INPUT_COLUMNS if evaluate_fn is evaluate else None,
                                     max_chunk=4 if options.engine == "des" else runner.DEFAULT_MAX_CHUNK)
    return phase


def trace_phase(config: GridConfig, options: RunOptions, executor):
    """Trace-driven points of every trace (None without traces), and the traces' measured quality."""
    from sim import traced, tradeoff
    dirs = options.trace_dirs()
    if not dirs:
        return None, None
    grid = traced.trace_grid(config, dirs, models=options.trace_models, prompts=options.trace_prompts,
                             gens=options.trace_gens, batches=options.trace_batches)
    if options.engine == "des":   # the serving simulator times base policies only (no noise variants)
        grid = grid[grid["policy_label"] == grid["policy"]].reset_index(drop=True)
    quality = pd.concat([tradeoff.measured_quality(traced.load_trace(str(d), tradeoff.trace_identity(d)),
                                                   traced.trace_label(d)) for d in dirs], ignore_index=True)
    evaluate_fn = evaluate_des if options.engine == "des" else traced.evaluate
    return run_phase("trace-driven points", grid, evaluate_fn, options, executor), quality


# ----------------------------------------------------------------------------------------------------
# CLI

def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m sim.sweep", description=__doc__.split("\n")[0])
    p.add_argument("--config", help="YAML file with grid axes (keys as in GridConfig) and run options")
    p.add_argument("--out", help="output folder (default results/sweep-<UTC timestamp>)")
    d = GridConfig.__dataclass_fields__
    default = lambda name: ",".join(str(v) for v in d[name].default_factory()) if name != "hw" else "datasheet devices"
    axes = [("--hw", "hw", str, "devices (names or YAML files)"), ("--models", "models", str, "models (names or configs)"),
            ("--policies", "policies", str, "policies"), ("--cache-ratios", "cache_ratios", float, "cache ratios"),
            ("--recent-ratios", "recent_ratios", float, "recent ratios"), ("--batches", "batches", int, "batch sizes"),
            ("--beams", "beams", int, "beam widths"), ("--prompts", "prompts", int, "prompt lengths"),
            ("--gens", "gens", int, "generation lengths"), ("--kv-dtypes", "kv_dtypes", str, "KV dtypes"),
            ("--weight-dtypes", "weight_dtypes", str, "weight dtypes"), ("--profiles", "profiles", str, "profiles")]
    for flag, dest, kind, what in axes:
        names = (flag, "--devices") if flag == "--hw" else (flag,)
        p.add_argument(*names, dest=dest, type=csv_list(kind, flag), metavar="A,B,..",
                       help=f"{what}, comma-separated (default {default(dest)})")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--csv", action="store_true",
                   help="also write points.csv beside points.parquet (about 9 MB for the default grid)")
    run_group = p.add_argument_group("execution (sim.runner)")
    run_group.add_argument("--workers", type=positive_int, metavar="N", help="local worker processes (default 1: this process)")
    run_group.add_argument("--scheduler", metavar="ADDRESS",
                           help="Dask scheduler address (tcp://host:8786): run the points on that cluster")
    run_group.add_argument("--cache-dir", metavar="DIR", help="per-point result cache (default .cache/sweep)")
    run_group.add_argument("--no-cache", action="store_true", help="compute every point, store nothing")
    run_group.add_argument("--engine", choices=ENGINES, help="analytic (default) or des (serving simulation per point)")
    run_group.add_argument("--qps", type=float, metavar="RATE", help="des: request rate per point (default inf: all at once)")
    run_group.add_argument("--requests", type=positive_int, metavar="N", help="des: requests per point (default 64)")
    trace_group = p.add_argument_group("trace-driven points (measured KV lengths and quality)")
    trace_group.add_argument("--traces", type=csv_list(str, "--traces"), metavar="DIR,..",
                             help="trace folders, 'bundled' (default: traces/data/) or 'none'")
    trace_group.add_argument("--trace-models", type=csv_list(str, "--trace-models"), metavar="M,..",
                             help="models to predict them for: 'own' (default: the model the trace ran) and/or names")
    for flag in ("--trace-prompts", "--trace-gens"):
        trace_group.add_argument(flag, type=csv_list(_own_or_int, flag), metavar="N,..",
                                 help="'own' (default: the trace's own lengths) and/or token counts")
    trace_group.add_argument("--trace-batches", type=csv_list(int, "--trace-batches"), metavar="B,..",
                             help="batch sizes for trace-driven points (default 1; throughput at the largest "
                                  "batch that fits is computed for every point)")
    return p


def _own_or_int(text: str):
    return OWN if text == OWN else int(text)


def config_from_args(a) -> tuple[GridConfig, RunOptions]:
    base, base_options = load_config(a.config) if a.config else (GridConfig(), RunOptions())
    overrides = {f.name: getattr(a, f.name) for f in fields(GridConfig) if getattr(a, f.name, None) is not None}
    config = GridConfig(**{**asdict(base), **overrides}) if overrides else base
    run_overrides = {f.name: getattr(a, f.name) for f in fields(RunOptions) if getattr(a, f.name, None) is not None}
    if a.no_cache:
        run_overrides["cache_dir"] = None
    options = RunOptions(**{**asdict(base_options), **run_overrides})
    return config, options


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    config, options = config_from_args(a)
    out_dir = Path(a.out) if a.out else Path("results") / f"sweep-{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}"
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"--out {out_dir} exists and is not a folder")
    t0 = time.perf_counter()
    points = build_grid(config)
    options.trace_dirs()  # a wrong trace folder is a one-line error before any work
    executor = runner.make_executor(options.workers, options.scheduler)
    phases = []
    try:
        grid_fn = evaluate_des if options.engine == "des" else evaluate
        phases.append(run_phase("design points", points, grid_fn, options, executor))
        traced_phase, quality = trace_phase(config, options, executor)
    except KeyboardInterrupt:
        where = f" in {options.cache_dir}" if options.cache_dir else ""
        print(f"interrupted: finished points are saved{where}; rerun the same command to resume", file=sys.stderr)
        raise
    finally:
        if hasattr(executor, "close"):
            executor.close()
    table = phases[0].table
    meta = dict(eval_s=phases[0].result.seconds, points_per_s=len(points) / max(phases[0].result.seconds, 1e-9),
                config=asdict(config), options=asdict(options), engine=options.engine,
                execution=[_execution_line(p) for p in phases + ([traced_phase] if traced_phase else [])],
                code_version=runner.code_version())
    import sim.plots as plots
    plots.ENABLED = not a.no_plots   # set both ways: a module flag would otherwise outlive one main() call
    # unchanged figures are copied from the cache (drawing them is most of a warm rerun's time)
    plots.CACHE_DIR = Path(options.cache_dir) / "plots" if options.cache_dir else None
    if traced_phase is not None:
        from sim import tradeoff
        throughput = "tokens_per_s" if options.engine == "des" else "max_batch_tokens_per_s"
        joined = tradeoff.join_quality(traced_phase.table, quality)
        meta["tradeoff_md"] = tradeoff.write_tradeoff(joined, out_dir, throughput, plots=not a.no_plots)
    if options.engine == "des":
        write_des_outputs(table, out_dir, meta, csv=a.csv)
    else:
        write_outputs(table, out_dir, meta, csv=a.csv)
    print(f"{len(table):,} points in {phases[0].result.seconds:.2f} s ({meta['points_per_s']:,.0f} points/s, "
          f"{phases[0].result.n_cached:,} from cache); total {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    print(out_dir)
    return 0


def _execution_line(phase: Phase) -> str:
    r = phase.result
    cache = f"cache {r.cache_dir}" if r.cache_dir else "no cache"
    return (f"{phase.name}: {r.n_points:,} points, {r.n_computed:,} computed in {r.seconds:.2f} s "
            f"({r.points_per_s:,.0f} points/s), {r.n_cached:,} from the cache; {r.executor}; {cache}")


if __name__ == "__main__":
    sys.exit(run(main))
