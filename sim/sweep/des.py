"""The sweep's discrete-event engine: one `sim.serve` run per design point, and its summary."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from sim.cli import atomic_write_text
from sim.sweep.summary import _execution_markdown, _md_table, _write_points

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
    lines += meta.get("layouts_md", [])
    atomic_write_text(out_dir / "summary.md", "\n".join(lines))
    written.append(out_dir / "summary.md")
    return written


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
