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
    rates = list(dict.fromkeys(table["qps"]))
    at = f"{rates[0]:g} requests/s" if len(rates) == 1 else f"each of {', '.join(f'{q:g}' for q in rates)} requests/s"
    lines = ["# kvsim sweep (discrete-event serving simulation)", ""]
    if "workload" in table.columns:
        lines += workload_lines(table, at)
    else:
        lines += [f"{len(table):,} design points; each is one `sim.serve` run of {int(table['requests'].iloc[0])} "
                  f"requests at {at} with at most `batch` in flight.", ""]
    dists = [f"{what} lengths {table[col].iloc[0]}" for what, col in (("prompt", "prompt_dist"), ("output", "gen_dist"))
             if col in table.columns]
    if dists:
        lines += [f"Request lengths drawn per request around each point's prompt / gen (sim.des.lengths): "
                  f"{', '.join(dists)}.", ""]
    lines += _execution_markdown(meta)
    keys = ["hw", "model", "policy", "cache_ratio"] + (["qps"] if len(rates) > 1 else [])
    if shown and (~failed).any():
        view = table[~failed].groupby(keys, as_index=False)[shown].mean()
        lines += ["## Mean over the other axes", "", _md_table(view.round(4)), ""]
    if "max_qps_slo" in table.columns and (~failed).any():
        lines += slo_markdown(table[~failed])
    if failed.any():
        lines += [f"{int(failed.sum())} points could not run (column `des_error`), e.g.: "
                  f"{table.loc[failed, 'des_error'].iloc[0]}", ""]
    lines += meta.get("tradeoff_md", [])
    lines += meta.get("layouts_md", [])
    atomic_write_text(out_dir / "summary.md", "\n".join(lines))
    written.append(out_dir / "summary.md")
    return written


def workload_lines(table: pd.DataFrame, at: str) -> list[str]:
    """The replayed trace of a workload sweep: which, which part, at which rates, its attribution."""
    from sim.des.trace_file import resolve
    name, window = table["workload"].iloc[0], table["window"].iloc[0] if "window" in table.columns else None
    part = f", window {window} s" if isinstance(window, str) else ""
    attribution = resolve(name)[2]
    return [f"{len(table):,} design points; each is one `sim.serve` replay of the request trace {name}{part} "
            f"(its arrival times and lengths), time-scaled to {at}, with at most `batch` in flight; requests "
            f"past the model's context: {table['overlong'].iloc[0]}, counted in the column overlong_requests.", "",
            *([f"Trace: {attribution}.", ""] if attribution else [])]


def slo_markdown(table: pd.DataFrame) -> list[str]:
    """The SLO capacity per device, model, policy and cache ratio (the smallest over the other axes but qps,
    which the search does not use), with full attention's beside it."""
    limits = [f"P99 {name} <= {table[col].iloc[0]:g} s" for name, col in (("TTFT", "slo_ttft_p99"),
              ("TPOT", "slo_tpot_p99")) if col in table.columns and pd.notna(table[col].iloc[0])]
    keys = ["hw", "model", "policy", "cache_ratio"]
    view = table.groupby(keys, as_index=False).agg(max_qps_slo=("max_qps_slo", "min"), runs=("slo_runs", "max"))
    full = view[view["policy"] == "full"].groupby(["hw", "model"])["max_qps_slo"].max()
    view["vs_full"] = [row.max_qps_slo / full.get((row.hw, row.model), float("nan"))
                       if full.get((row.hw, row.model), 0) > 0 else float("nan") for row in view.itertuples()]
    return ["## Highest request rate meeting the SLO", "",
            f"{' and '.join(limits)}: the highest Poisson rate (req/s) found by sim.des.slo's search over log qps "
            "at steady state (warm-up excluded; within 5%, the bracket checked with twice the measured requests, "
            "columns slo_requests and slo_stable; `inf`: every request at once meets it; 0: no rate does), its "
            "ratio to full attention's on the same device and model, and the simulations one search ran "
            "(columns max_qps_slo, slo_bound).", "",
            _md_table(view.round(3)), ""]


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
                       max_batch=int(point["batch"]), qps=float(point["qps"]),
                       requests=None if _missing(point.get("requests")) else int(point["requests"]))
        if isinstance(point.get("workload"), str):     # a replayed trace (sim.des.workload): its lengths
            options.update(request_trace=point["workload"], overlong=point.get("overlong", "drop"),
                           window=point["window"] if isinstance(point.get("window"), str) else None)
        if isinstance(point.get("trace_path"), str):
            options["trace"] = point["trace_path"]
        for key in ("prompt_dist", "gen_dist"):
            if isinstance(point.get(key), str):
                options[key] = point[key]
        try:
            res = serve.simulate(point["hw"], model, _policy(point), point["cache_ratio"], **options)
            row = {**res.to_row(), "des_error": ""}
            if "replay" in res.config:     # never silently: the requests the context cut
                row["overlong_requests"] = res.config["replay"]["overlong_requests"]
            slo = _point_slo(point)
            if slo is not None:
                row.update(_slo_columns(point, model, options, slo))
            rows.append(row)
        except ValueError as exc:
            rows.append({"des_error": str(exc).splitlines()[0]})
    return pd.DataFrame(rows)


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and pd.isna(value))


def _policy(point) -> str:
    """The policy string the DES runs: a trace point's captured variant label (its rows in the trace), else
    the grid's policy (a label too: sim.policies.variants)."""
    label = point.get("policy_label")
    return label if isinstance(label, str) else point["policy"]


_SEARCHES: dict = {}   # (ServeConfig, SLO) -> SearchResult, within one process
SLO_COLUMNS = ["max_qps_slo", "slo_fail_qps", "slo_runs", "slo_ttft_s_p99", "slo_tpot_s_p99", "slo_requests",
               "slo_stable", "slo_bound"]


def _point_slo(point):
    from sim.des.slo import SLO
    limits = {k: float(point[k]) for k in ("slo_ttft_p99", "slo_tpot_p99")
              if k in point and point[k] is not None and not pd.isna(point[k])}
    return SLO(**limits) if limits else None


def _slo_columns(point, model, options, slo) -> dict:
    """The point's SLO capacity at steady state (sim.des.slo.find_max_qps; its qps and requests do not enter:
    the search picks its own run lengths): the rate, the bracket's top, the simulations run, the measured
    P99s at the rate, the measured requests that settled it, whether it is stable and what bounds it."""
    from sim.des.serving import ServeConfig
    from sim.des.slo import find_max_qps
    cfg = ServeConfig(hw=point["hw"], model=model, policy=_policy(point), cache_ratio=point["cache_ratio"],
                      **{k: v for k, v in options.items() if k != "qps"})
    key = (repr(cfg), slo)
    if key not in _SEARCHES:        # the search ignores qps: a qps axis asks the same question once per rate
        if len(_SEARCHES) > 256:
            _SEARCHES.clear()
        _SEARCHES[key] = find_max_qps(cfg, slo)
    found = _SEARCHES[key]
    measured = found.to_dict()
    return {"max_qps_slo": found.max_qps, "slo_fail_qps": found.fail_qps if found.fail_qps is not None else float("nan"),
            "slo_runs": found.runs, "slo_ttft_s_p99": measured.get("ttft_s_p99", float("nan")),
            "slo_tpot_s_p99": measured.get("tpot_s_p99", float("nan")), "slo_requests": found.requests,
            "slo_stable": found.stable, "slo_bound": found.reason}
