"""Published reference points: data files with one citation per row (sim/references/*.csv).

Adding a reference is adding a row. Columns (all required; baseline_* empty unless the metric is a ratio):

  id                    unique name of the row (used in the report)
  paper, where          citation: the paper, and the table/figure (or text) the number comes from
  setting, precision    the setting as the paper states it, and how exactly the value was read
  model, device         a sim.models name and a hwmodels device name
  software              the profile that models the stack the paper ran (hf-eager, fused, ...)
  dtype                 weights and KV dtype of the run
  batch, beam, prompt, gen, policy, cache_ratio
  metric                tokens_per_s | speedup | kv_movement_ratio | kv_time_share | max_batch
  baseline_policy, baseline_cache_ratio, baseline_batch   the denominator of a ratio metric
  value, unit           the published number
  regime                decode-b1 | decode-large-batch | prefill | eviction-ratio | breakdown | capacity

Metric definitions (what the simulator computes for the row):
  tokens_per_s        batch * gen / end-to-end time (prefill included), as the engine's Prediction.tokens_per_s
  speedup             tokens_per_s of the row / tokens_per_s of its baseline (same prompt, gen, beams)
  kv_movement_ratio   KV data-movement time over the generation, row / baseline. The KV data-movement time
                      of an operator is its time times the KV share of its bytes; cache copies (concat,
                      reorder, compaction) are all KV.
  kv_time_share       KV data-movement time / end-to-end time of the row's request
  max_batch           the largest batch (requests) whose peak memory fits the device with every request at
                      its peak at once, as a static batch runs (Prediction.max_batch_all_at_once)
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

REFERENCES_DIR = Path(__file__).resolve().parents[1] / "references"
METRICS = ("tokens_per_s", "speedup", "kv_movement_ratio", "kv_time_share", "max_batch")
RATIO_METRICS = ("speedup", "kv_movement_ratio")
REGIMES = ("decode-b1", "decode-large-batch", "prefill", "eviction-ratio", "breakdown", "capacity")
COLUMNS = ("id", "paper", "where", "setting", "precision", "model", "device", "software", "dtype", "batch",
           "beam", "prompt", "gen", "policy", "cache_ratio", "metric", "baseline_policy",
           "baseline_cache_ratio", "baseline_batch", "value", "unit", "regime")


def load_references(paths=None) -> pd.DataFrame:
    """All reference rows of the given CSV files (default: every sim/references/*.csv), validated.

    Raises ValueError naming the file, row id and column of the first problem.
    """
    files = [Path(p) for p in paths] if paths else sorted(REFERENCES_DIR.glob("*.csv"))
    frames = []
    for path in files:
        if not path.is_file():
            raise FileNotFoundError(f"reference file {path} not found")
        try:
            table = pd.read_csv(path, dtype={"id": str}, keep_default_na=True)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
            raise ValueError(f"{path}: not a readable CSV ({str(exc).splitlines()[0]})") from None
        missing = [c for c in COLUMNS if c not in table.columns]
        if missing:
            raise ValueError(f"{path}: missing column(s) {', '.join(missing)}")
        table["file"] = path.name
        _check(table, path)
        frames.append(table)
    if not frames:
        return pd.DataFrame(columns=list(COLUMNS) + ["file"])
    refs = pd.concat(frames, ignore_index=True)
    dup = refs["id"][refs["id"].duplicated()]
    if len(dup):
        raise ValueError(f"reference id {dup.iloc[0]!r} appears more than once")
    return refs


def _check(table: pd.DataFrame, path: Path) -> None:
    for i, row in table.iterrows():
        where = f"{path.name} row {i + 2} ({row['id']})"
        for col in ("id", "paper", "where", "setting", "model", "device", "software", "dtype", "policy", "metric",
                    "regime"):
            if not isinstance(row[col], str) or not row[col].strip():
                raise ValueError(f"{where}: column {col} is empty (every row needs its citation and setting)")
        if row["metric"] not in METRICS:
            raise ValueError(f"{where}: metric {row['metric']!r} is not one of {', '.join(METRICS)}")
        if row["regime"] not in REGIMES:
            raise ValueError(f"{where}: regime {row['regime']!r} is not one of {', '.join(REGIMES)}")
        for col in ("batch", "beam", "prompt", "gen", "cache_ratio", "value"):
            value = pd.to_numeric(row[col], errors="coerce")
            if not np.isfinite(value) or value <= 0:
                raise ValueError(f"{where}: column {col} must be a positive number, got {row[col]!r}")
        if row["metric"] in RATIO_METRICS:
            for col in ("baseline_policy", "baseline_cache_ratio", "baseline_batch"):
                if pd.isna(row[col]) or str(row[col]).strip() == "":
                    raise ValueError(f"{where}: a {row['metric']} row needs {col}")


@dataclass(frozen=True)
class Run:
    """One simulated request of a reference row (or of its baseline)."""
    model: str
    device: str
    profile: str
    dtype: str
    batch: int
    beams: int
    prompt: int
    gen: int
    policy: str
    cache_ratio: float


def row_runs(row) -> tuple[Run, Run | None]:
    run = Run(row["model"], row["device"], row["software"], row["dtype"], int(row["batch"]), int(row["beam"]),
              int(row["prompt"]), int(row["gen"]), row["policy"], float(row["cache_ratio"]))
    if row["metric"] not in RATIO_METRICS:
        return run, None
    base = Run(run.model, run.device, run.profile, run.dtype, int(row["baseline_batch"]), run.beams, run.prompt,
               run.gen, row["baseline_policy"], float(row["baseline_cache_ratio"]))
    return run, base


def describe(row) -> str:
    text = (f"{row['model']} {row['device']} {row['dtype']} b{int(row['batch'])}x{int(row['beam'])}beam "
            f"{int(row['prompt'])}+{int(row['gen'])} {row['policy']}")
    if row["policy"] != "full":
        text += f" {float(row['cache_ratio']):g}"
    if row["metric"] in RATIO_METRICS:
        text += f" vs {row['baseline_policy']}"
        if int(row["baseline_batch"]) != int(row["batch"]):
            text += f" b{int(row['baseline_batch'])}"
    return text
