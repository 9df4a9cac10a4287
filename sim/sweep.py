"""`python -m sim.sweep`: evaluate a grid of design points and write a table, plots and a summary.

    python -m sim.sweep                                  # embedded defaults (datasheet devices x 4 models x ...)
    python -m sim.sweep --hw h100-sxm,l4 --models llama-3-8b --cache-ratios 0.2,0.5,1 --out results/mine
    python -m sim.sweep --config grid.yaml               # same keys as GridConfig; flags override the file

Three pure steps, so another runner can chunk and cache the middle one:
    build_grid(config) -> DataFrame of inputs (one row per point)
    evaluate(points)   -> DataFrame of outputs, one row per input row, same order
    write_outputs(table, out_dir)
"""
from __future__ import annotations

import hashlib
import itertools
import json
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd

from hwmodels.dtypes import canonical_dtype
from sim import engine
from sim.cli import ArgumentParser, atomic_write_text, atomic_writer, csv_list, run
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
                in_range = 0 < v <= 1 if lo_open else 0 <= v <= 1
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not in_range:
                    raise ValueError(f"grid {name}: {v!r} out of range {'(0, 1]' if lo_open else '[0, 1]'}")
        for v in self.policies:
            if v not in POLICIES:
                raise ValueError(f"grid policies: unknown policy {v!r}; expected {', '.join(POLICIES)}")
        self.kv_dtypes = [canonical_dtype(v) for v in self.kv_dtypes]
        self.weight_dtypes = [canonical_dtype(v) for v in self.weight_dtypes]
        self.hw = [str(v) for v in self.hw]
        self.models = [str(v) for v in self.models]

    @classmethod
    def from_yaml(cls, path) -> "GridConfig":
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
        if "devices" in data and "hw" not in data:
            data["hw"] = data.pop("devices")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"config {path}: unknown key {unknown[0]!r}; expected {', '.join(sorted(known))}")
        try:
            return cls(**data)
        except ValueError as exc:
            raise ValueError(f"config {path}: {exc}") from None


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
    df = pd.DataFrame(list(itertools.product(*axes)), columns=INPUT_COLUMNS)
    # cells keep the user's spelling (a name or a file path), so evaluate() can load them anywhere
    df["hw_hash"] = df["hw"].map({n: d.content_hash for n, d in devices.items()})
    df["model_hash"] = df["model"].map({n: _model_hash(s) for n, s in specs.items()})
    return df


OUTPUT_COLUMNS = ["ttft_s", "tpot_s", "e2e_s", "tokens_per_s", "peak_memory_bytes", "fits", "max_batch",
                  "max_batch_tokens_per_s", "max_batch_tpot_s", "decode_bound", "decode_kv_read_bytes",
                  "decode_memory_time_s", "decode_compute_time_s", "kv_bytes_per_token", "peak_kv_tokens",
                  "weight_bytes", "device_memory_bytes", "exceeds_max_positions"]


def _names(column: pd.Series):
    """One name when the column holds one value (the engine's fast path), else the array."""
    values = column.to_numpy()
    return values[0] if (values == values[0]).all() else values


def evaluate(points: pd.DataFrame, progress: bool = False) -> pd.DataFrame:
    """Outputs for each row of `points` (same order, fresh RangeIndex). Pure: chunks evaluate alike.

    `hw` and `model` cells are names or file paths; only INPUT_COLUMNS are read."""
    from hwmodels import load_device
    from tqdm import tqdm
    points = points.reset_index(drop=True)
    kinds = {"fits": bool, "max_batch": np.int64, "decode_bound": object, "exceeds_max_positions": bool}
    out = {c: np.empty(len(points), dtype=kinds.get(c, float)) for c in OUTPUT_COLUMNS}
    devices, specs = {}, {}
    groups = points.groupby(GROUP_COLUMNS, sort=False).indices
    # disable=None: the bar shows on a terminal only, never in logs
    for key, idx in tqdm(groups.items(), desc="sweep", unit="group", disable=None if progress else True,
                         file=sys.stderr):
        hw_name, model_name, policy, profile = key
        if hw_name not in devices:
            devices[hw_name] = load_device(hw_name)
        if model_name not in specs:
            specs[model_name] = load_model(model_name)
        hw, spec = devices[hw_name], specs[model_name]
        rows = points.iloc[idx]
        r = engine.evaluate(hw, spec, policy, batch=rows["batch"].to_numpy(), prompt=rows["prompt"].to_numpy(),
                            gen=rows["gen"].to_numpy(), cache_ratio=rows["cache_ratio"].to_numpy(),
                            recent_ratio=rows["recent_ratio"].to_numpy(), beams=rows["beams"].to_numpy(),
                            kv_dtype=_names(rows["kv_dtype"]), weight_dtype=_names(rows["weight_dtype"]),
                            profile=profile)
        r["device_memory_bytes"] = np.full(len(idx), float(hw.memory_bytes))
        total = rows["prompt"].to_numpy() + rows["gen"].to_numpy()
        r["exceeds_max_positions"] = total > spec.max_positions if spec.max_positions else np.zeros(len(idx), bool)
        for col in OUTPUT_COLUMNS:
            out[col][idx] = r[col]
    return pd.DataFrame(out, index=points.index)


def write_outputs(table: pd.DataFrame, out_dir, meta: dict | None = None) -> list[Path]:
    """points.parquet, points.csv, PNG plots and summary.md under out_dir (each written atomically)."""
    from sim import plots
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, write in (("points.parquet", lambda p: table.to_parquet(p, index=False)),
                        ("points.csv", lambda p: table.to_csv(p, index=False))):
        atomic_writer(out_dir / name, write)
        written.append(out_dir / name)
    written += plots.sweep_plots(table, out_dir)
    atomic_write_text(out_dir / "summary.md", summary_markdown(table, meta or {}))
    written.append(out_dir / "summary.md")
    return written


def _md_table(df: pd.DataFrame) -> str:
    head = "| " + " | ".join(df.columns) + " |\n|" + "---|" * len(df.columns) + "\n"
    return head + "".join("| " + " | ".join(str(v) for v in row) + " |\n" for row in df.itertuples(index=False))


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
        "throughput gain": (j["max_batch_tokens_per_s_ev"] / j["max_batch_tokens_per_s_full"].where(
            j["max_batch_tokens_per_s_full"] > 0)).round(2),
    })


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
    lines += ["## What a smaller cache buys", ""]
    for policy, ratio in (("keyformer", 0.5), ("h2o", 0.9)):
        h = headline(table, policy, ratio)
        if not h.empty:
            p0, g0 = table["prompt"].max(), table["gen"].max()
            title = f"### {policy} vs full, prompt {p0} + gen {g0}, batch {table['batch'].min()}"
            lines += [title, "", _md_table(h), ""]
    fits = table["fits"].mean()
    lines += ["## Notes", "",
              f"- {100 * (1 - fits):.1f}% of points do not fit in device memory at their batch (column `fits`).",
              f"- {int(table['exceeds_max_positions'].sum()):,} points exceed the model's trained context "
              "(`exceeds_max_positions`); they are kept as what-if rows.",
              "- Plots: latency_vs_cache_ratio.png, throughput_vs_batch.png, max_batch_throughput_vs_cache_ratio.png.",
              ""]
    return "\n".join(lines)


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m sim.sweep", description=__doc__.split("\n")[0])
    p.add_argument("--config", help="YAML file with grid axes (keys as in GridConfig)")
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
    return p


def config_from_args(a) -> GridConfig:
    base = GridConfig.from_yaml(a.config) if a.config else GridConfig()
    overrides = {f.name: getattr(a, f.name) for f in fields(GridConfig) if getattr(a, f.name, None) is not None}
    return GridConfig(**{**asdict(base), **overrides}) if overrides else base


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    config = config_from_args(a)
    out_dir = Path(a.out) if a.out else Path("results") / f"sweep-{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}"
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"--out {out_dir} exists and is not a folder")
    t0 = time.perf_counter()
    points = build_grid(config)
    t1 = time.perf_counter()
    outputs = evaluate(points, progress=True)
    t2 = time.perf_counter()
    table = pd.concat([points.reset_index(drop=True), outputs], axis=1)
    meta = dict(eval_s=t2 - t1, points_per_s=len(points) / max(t2 - t1, 1e-9), config=asdict(config))
    if a.no_plots:
        import sim.plots as plots
        plots.ENABLED = False
    write_outputs(table, out_dir, meta)
    print(f"{len(table):,} points in {t2 - t1:.2f} s ({meta['points_per_s']:,.0f} points/s); "
          f"total {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    print(out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
