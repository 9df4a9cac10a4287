"""The published-GPU section of `python -m sim.validate`: engine profiles against vendors' measurements.

Every single-device row of the published CSV (sim/validation/published_gpu.py) is predicted twice on
the engine as it is now: with the terms of the shipped profile file (in-sample: those terms were fitted
to these rows) and with the terms fitted without the row's source family (leave-one-source-family-out,
"LOSO" in the tables: the file keeps one set of terms per family, sim/validation/sources.yaml). LOSO beside
in-sample shows over-fitting; the targets are stated on LOSO, and the fitted profile's LOSO error is set
beside the ideal-kernel profile's (`fused`, never fitted) on the same rows. The file's own predictions are compared with today's: when the engine's op costs have
moved since the fit, the section says so (re-run `python -m sim.fit_profiles`).

Each regime's MAPE carries a 95% bootstrap interval over sources (a source's rows resampled together; none
for a regime of one source). The family-transfer table says, per family, how the other families' rows fare out
of sample and where the whole set would be with this family's rows at their in-sample error: the family whose
swap alone meets the targets is the one whose transfer keeps them out of reach.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from sim.profiles import engines as pe
from sim.validation import published_gpu as pg
from sim.validation.published_plot import PLOT_NAME
from traces.stats import LEVEL, N_BOOT, bootstrap

LOSO_TARGET_OVERALL = 10.0
LOSO_TARGET_REGIME = 15.0
STALE_PCT = 0.5            # in-sample predictions moved by more than this since the fit: stale
# The examples (issue 13): TensorRT-LLM v0.9.0, Mistral-7B, batch 120, 128 + 2048, FP8.
EXAMPLES = ("TRT090/h200-sxm/mistral-7b-v0.1/b120/128+2048/out_tok_per_s",
            "TRT090/h100-sxm/mistral-7b-v0.1/b120/128+2048/out_tok_per_s")
GPU_RUN_NOTE = ("No GPU run entered this report: no GPU was lent to this session (issue 13 part 5); "
                "`workflows/gpu/` holds the script to run when one is.")


TABLE_COLUMNS = ("id", "source", "family", "engine", "regime", "hw", "model", "metric", "batch", "prompt", "gen", "measured",
                 "trained", "predicted", "error_pct", "loso", "loso_error_pct", "fused_error_pct", "moved_pct")


@dataclass
class Section:
    markdown: list[str]
    summary: dict = field(default_factory=dict)
    table: pd.DataFrame | None = None


def _stats(df: pd.DataFrame, column: str) -> dict:
    err = df[column].abs()
    return {"points": int(len(df)), "mape": round(float(err.mean()), 3), "max_error": round(float(err.max()), 3)}


def _interval(df: pd.DataFrame, column: str) -> list[float] | None:
    """95% percentile-bootstrap interval [lo, hi] of the MAPE, resampling whole sources (the rows of one published
    table share its harness and its errors: they are not independent); seeded (traces.stats). None: one source."""
    ci = bootstrap(df[column].abs().to_numpy(float), df["source"].to_numpy())
    return [round(ci.lo, 3), round(ci.hi, 3)] if np.isfinite(ci.lo) and np.isfinite(ci.hi) else None


def _with_interval(mape: float, ci: list[float] | None) -> str:
    return f"{mape:.1f}" if ci is None else f"{mape:.1f} [{ci[0]:.1f}, {ci[1]:.1f}]"


def family_transfer(table: pd.DataFrame) -> dict:
    """Per source family, what its transfer costs out of sample: the LOSO MAPE of the other families' rows, and
    the overall and worst-regime LOSO MAPE if this family's rows were predicted at their in-sample error (as
    well as its terms fitted on its own rows allow) while every other row keeps its LOSO error. A family whose
    swap alone meets the targets is the one that keeps them out of reach."""
    trained = table[table["trained"]]
    loso, in_sample = trained["loso_error_pct"].abs(), trained["error_pct"].abs()
    present = [g for g in pg.REGIMES if g in set(trained["regime"])]
    out = {}
    for family, fdf in trained.groupby("family", sort=False):
        mine = trained["family"] == family
        swapped = loso.where(~mine, in_sample)
        regimes = {g: float(swapped[trained["regime"] == g].mean()) for g in present}
        worst = max(regimes, key=regimes.get)
        out[family] = {"rows": int(len(fdf)), "others_loso_mape": round(float(loso[~mine].mean()), 3),
                       "overall_if_in_sample": round(float(swapped.mean()), 3),
                       "worst_regime_if_in_sample": worst, "worst_regime_mape_if_in_sample": round(regimes[worst], 3)}
    return out


def family_transfer_lines(transfer: dict) -> list[str]:
    if not transfer:
        return []
    lines = ["What each family's transfer costs: the other families' rows out of sample, and the whole set's LOSO "
             "MAPE with this family's rows at their in-sample error instead (every other row out of sample):", "",
             "| family | rows | other rows, LOSO MAPE % | overall, this family in sample % | worst regime, this family "
             "in sample % |", "|---|---|---|---|---|"]
    for family, t in transfer.items():
        lines.append(f"| {family} | {t['rows']} | {t['others_loso_mape']:.1f} | {t['overall_if_in_sample']:.1f} | "
                     f"{t['worst_regime_mape_if_in_sample']:.1f} ({t['worst_regime_if_in_sample']}) |")
    return lines + [""]


def evaluate_rows(fit_file: Path | str = pe.FIT_FILE, csv: Path | str | None = None) -> tuple[pd.DataFrame, dict, list]:
    """Every single-device row under its stack's profile (file terms) and, for rows whose source was in
    the fit, under the terms fitted without that source (LOSO). A row the fit never saw (another CSV:
    the held-out check) is out of sample either way: its LOSO value is its prediction."""
    data = pe.read_fit_file(fit_file)
    profiles = {e: pe.make_profile(e, pe.engine_values(data, e, fit_file), name=f"{e}-file")
                for e in pe.ENGINES if e in data["engines"]}
    folds = data["engines"].get("trtllm", {}).get("loso_folds") or {}
    fold_profiles = {s: pe.make_profile("trtllm", pe.check_values(v, f"{fit_file}: loso fold {s}"),
                                        name=f"trtllm-loso-{s}") for s, v in folds.items()}
    stored = {(p.get("csv"), p.get("row")): p for p in data.get("predictions", [])}
    rows = pg.load_rows(csv)
    scoped = [r for r in pg.in_scope(rows) if r.engine in profiles]
    out, unpredictable = [], []
    for r in scoped:
        key = (r.csv, r.index)
        trained = key in stored and stored[key]["id"] == r.id
        fold = fold_profiles.get(r.family) if trained else None
        try:
            pred = pg.predict_row(r, profiles[r.engine])
            loso = pg.predict_row(r, fold) if fold is not None else pred
            fused = pg.predict_row(r, "fused")
        except ValueError as exc:                      # e.g. a held-out row whose point the engine refuses
            unpredictable.append(replace(r, scope=f"not predicted: {exc}"))
            continue
        then = stored.get(key, {}).get("in_sample") if trained else None
        out.append(dict(id=r.id, source=r.source, family=r.family, engine=r.engine, regime=r.regime, hw=r.hw, model=r.model,
                        metric=r.metric, batch=r.batch_kind if r.batch_kind != "static" else r.batch,
                        prompt=r.prompt, gen=r.gen,
                        measured=r.value, trained=trained, predicted=pred, error_pct=pg.error_pct(pred, r.value),
                        loso=loso, loso_error_pct=pg.error_pct(loso, r.value),
                        fused_error_pct=pg.error_pct(fused, r.value),
                        moved_pct=np.nan if then is None else pg.error_pct(pred, then)))
    excluded = [r for r in rows if r not in scoped] + unpredictable
    return pd.DataFrame(out, columns=TABLE_COLUMNS), data, excluded


def _fmt(v, digits=1) -> str:
    return "-" if v is None or (isinstance(v, float) and not np.isfinite(v)) else f"{v:+.{digits}f}"


def build_section(fit_file: Path | str = pe.FIT_FILE, csv: Path | str | None = None) -> Section:
    csv_paths = [Path(csv)] if csv is not None else pg.default_csvs()
    csv_label = ", ".join(pg.display_path(c) for c in csv_paths)
    head = ["## Published GPU measurements (engine profiles)", ""]
    if not all(c.is_file() for c in csv_paths):
        return Section(head + [f"Skipped: the published CSV {csv_label} is not here (set KVSIM_DATA "
                               "or pass --published-gpu); the profiles themselves ship in "
                               f"{pg.display_path(Path(fit_file))}.", "", GPU_RUN_NOTE, ""],
                       {"skipped": f"{csv_label} not found"})
    csv_path = csv_paths if len(csv_paths) > 1 else csv_paths[0]
    table, data, excluded = evaluate_rows(fit_file, csv_path)
    fit = data.get("fit", {})
    multi_lines, multi_summary = multi_gpu_lines(csv_path)
    if not len(table):
        lines = head + [f"No single-device row of {csv_label} can be predicted (each row's reason "
                        "below).", "", *excluded_lines(excluded), *multi_lines, GPU_RUN_NOTE, ""]
        return Section(lines, {"rows": 0, "regimes": {}, "excluded": [r.id for r in excluded],
                               "multi_gpu": multi_summary, "gpu_run": GPU_RUN_NOTE}, table)
    lines = head + [
        f"Rows: {len(table)} single-device rows of {csv_label}, each predicted under its stack's "
        f"profile (`trtllm`, `vllm`, with the row's runtime and decode kernels: sim/engine_profiles/stacks.yaml) of "
        f"{pg.display_path(Path(fit_file))}, fitted {fit.get('date', '?')} by `{fit.get('command', '?')}`. "
        "In-sample: the file's terms (fitted to all these rows); LOSO: each row predicted with the terms fitted "
        "without its source family's rows (sim/validation/sources.yaml). Fused: the ideal `fused` profile, never "
        "fitted. "
        f"Targets: LOSO MAPE <= {LOSO_TARGET_OVERALL:g}% overall and <= {LOSO_TARGET_REGIME:g}% in every regime.", ""]
    held_out = table[~table["trained"]]
    held_out_summary = None
    if len(held_out):
        lines += [f"{len(held_out)} of these rows were not among the fit's rows (another CSV or new rows): they are "
                  "held out, their error is out of sample in every column (row table: trained = no).", ""]
    moved = table["moved_pct"].abs().max()
    stale = bool(np.isfinite(moved) and moved > STALE_PCT)
    if stale:
        lines += [f"WARNING: predictions with the file's terms moved by up to {moved:.1f}% since the fit (the engine's "
                  "op costs changed): the terms below are stale, re-run the fit command.", ""]
    regimes = [g for g in pg.REGIMES if g in set(table["regime"])]
    rows_out, summary_regimes = [], {}
    for group in regimes + ["overall"]:
        df = table if group == "overall" else table[table["regime"] == group]
        ins, lo, fu = _stats(df, "error_pct"), _stats(df, "loso_error_pct"), _stats(df, "fused_error_pct")
        ins_ci, lo_ci = _interval(df, "error_pct"), _interval(df, "loso_error_pct")
        target = LOSO_TARGET_OVERALL if group == "overall" else LOSO_TARGET_REGIME
        status = "PASS" if lo["mape"] <= target else "FAIL"
        summary_regimes[group] = {"points": ins["points"], "in_sample_mape": ins["mape"], "in_sample_max": ins["max_error"],
                                  "in_sample_ci": ins_ci, "loso_mape": lo["mape"], "loso_max": lo["max_error"],
                                  "loso_ci": lo_ci, "fused_mape": fu["mape"],
                                  "target_loso_mape": target, "status": status}
        rows_out.append(f"| {group} | {ins['points']} | {_with_interval(ins['mape'], ins_ci)} | "
                        f"{ins['max_error']:.1f} | {_with_interval(lo['mape'], lo_ci)} | "
                        f"{lo['max_error']:.1f} | {fu['mape']:.1f} | <= {target:g} | {status} |")
    lines += ["| regime | rows | in-sample MAPE % [95% CI] | in-sample max % | LOSO MAPE % [95% CI] | LOSO max % | "
              "fused MAPE % | target (LOSO) | status |", "|---|---|---|---|---|---|---|---|---|", *rows_out, "",
              f"Intervals: {LEVEL:.0%} percentile bootstrap over sources (the rows of one published table are "
              f"resampled together; {N_BOOT} resamples, seeded; none for a regime of one source).", "",
              f"![published GPU rows: predicted vs published]({PLOT_NAME})", ""]
    if len(held_out):
        h = _stats(held_out, "error_pct")
        held_out_summary = {"points": h["points"], "mape": h["mape"], "max_error": h["max_error"]}
        lines += [f"Held-out rows: {h['points']}, MAPE {h['mape']:.1f}%, max {h['max_error']:.1f}%.", ""]
    rate_rows = [p for p in data.get("predictions", []) if "little" in p]
    if rate_rows:
        lines += ["Request-rate rows, predicted through the DES (`published_gpu.des_rate`: Poisson arrivals, "
                  f"{pg.DES_REQUESTS} requests, reserve admission), beside their closed-form stand-in (Little's law), "
                  "on which the fit descends with a DES factor per row (sim/fit_profiles.py); in-sample terms, at fit "
                  "time:", "", "| row | measured | DES | Little's law |", "|---|---|---|---|"]
        for p in rate_rows:
            lines.append(f"| {p['id']} | {p['measured']:.4g} | {p['in_sample']:.4g} "
                         f"({_fmt(pg.error_pct(p['in_sample'], p['measured']))}%) | {p['little']:.4g} "
                         f"({_fmt(pg.error_pct(p['little'], p['measured']))}%) |")
        lines.append("")
    # per family: LOSO is "fit without this family, predict it"; per source within it
    trained_rows = table[table["trained"]]
    if len(trained_rows):
        fit_lo, fused_lo = _stats(trained_rows, "loso_error_pct"), _stats(trained_rows, "fused_error_pct")
        verdict = "beats" if fit_lo["mape"] < fused_lo["mape"] else "does not beat"
        lines += [f"Out of sample, the fitted profile {verdict} the ideal one: leave-one-family-out MAPE "
                  f"{fit_lo['mape']:.1f}% against {fused_lo['mape']:.1f}% for `fused` (never fitted) on the same "
                  f"{fit_lo['points']} rows.", ""]
    lines += ["| family (left out) | source | rows | in-sample MAPE % | LOSO MAPE % | LOSO max % | fused MAPE % |",
              "|---|---|---|---|---|---|---|"]
    by_source, by_family = {}, {}
    for family, fdf in table.groupby("family", sort=False):
        ins, lo, fu = _stats(fdf, "error_pct"), _stats(fdf, "loso_error_pct"), _stats(fdf, "fused_error_pct")
        by_family[family] = {"points": ins["points"], "in_sample_mape": ins["mape"], "loso_mape": lo["mape"],
                             "loso_max": lo["max_error"], "fused_mape": fu["mape"]}
        lines.append(f"| **{family}** | all | {ins['points']} | {ins['mape']:.1f} | {lo['mape']:.1f} | "
                     f"{lo['max_error']:.1f} | {fu['mape']:.1f} |")
        for source, df in fdf.groupby("source", sort=False):
            ins, lo, fu = _stats(df, "error_pct"), _stats(df, "loso_error_pct"), _stats(df, "fused_error_pct")
            by_source[source] = {"family": family, "points": ins["points"], "in_sample_mape": ins["mape"],
                                 "loso_mape": lo["mape"], "loso_max": lo["max_error"]}
            lines.append(f"| {family} | {source} | {ins['points']} | {ins['mape']:.1f} | {lo['mape']:.1f} | "
                         f"{lo['max_error']:.1f} | {fu['mape']:.1f} |")
    lines.append("")
    transfer = family_transfer(table)
    lines += family_transfer_lines(transfer)
    terms = data["engines"]["trtllm"]["terms"]
    lines += ["Fitted terms (shared by `trtllm` and `vllm` and by every device; each stack's host terms see only its "
              "rows; bounds are physical ranges, sim/profiles/engines.py):", "",
              "| term | value | bounds | meaning |", "|---|---|---|---|"]
    for name, t in terms.items():
        fitted = "" if not str(t.get("source", "")).startswith("not fitted") else " (not fitted: prior)"
        lines.append(f"| {name} | {float(t['value']):.4g} {t.get('unit', '')}{fitted} | {t.get('bounds')} | "
                     f"{t.get('meaning', '')} |")
    lines.append("")
    for engine_name, entry in data["engines"].items():
        if not entry.get("fitted", True):
            lines += [f"`{engine_name}`: {entry.get('reason', 'not fitted')}.", ""]
    examples = table[table["id"].isin(EXAMPLES)]
    if len(examples):
        lines += ["The issue's examples (TensorRT-LLM v0.9.0, Mistral-7B, batch 120, 128 + 2048, output tokens/s):", ""]
        for e in examples.itertuples():
            lines.append(f"- {e.hw}: measured {e.measured:,.0f}, trtllm {e.predicted:,.0f} ({_fmt(e.error_pct)}%), "
                         f"LOSO {e.loso:,.0f} ({_fmt(e.loso_error_pct)}%), fused {_fmt(e.fused_error_pct)}%")
        lines.append("")
    lines += ["| row | regime | trained | measured | predicted | error % | LOSO | LOSO error % | fused error % |",
              "|---|---|---|---|---|---|---|---|---|"]
    order = table.reindex(table["loso_error_pct"].abs().sort_values(ascending=False).index)
    for r in order.itertuples():
        lines.append(f"| {r.id} | {r.regime} | {'yes' if r.trained else 'no'} | {r.measured:.4g} | {r.predicted:.4g} | "
                     f"{_fmt(r.error_pct)} | "
                     f"{r.loso:.4g} | {_fmt(r.loso_error_pct)} | {_fmt(r.fused_error_pct)} |")
    lines.append("")
    lines += excluded_lines(excluded) + multi_lines + [GPU_RUN_NOTE, ""]
    summary = {"rows": int(len(table)), "regimes": summary_regimes, "by_source": by_source,
               "by_family": by_family, "family_transfer": transfer, "stale": stale,
               "held_out": held_out_summary,
               "terms": {k: float(v["value"]) for k, v in terms.items()},
               "examples": {e.id: {"measured": e.measured, "predicted": round(e.predicted, 1),
                                   "loso": round(e.loso, 1)} for e in examples.itertuples()},
               "excluded": [r.id for r in excluded], "multi_gpu": multi_summary, "gpu_run": GPU_RUN_NOTE}
    return Section(lines, summary, table)


def excluded_lines(excluded: list) -> list[str]:
    """The rows neither fitted nor checked here, each with its reason (multi-GPU rows: the next table)."""
    if not excluded:
        return []
    return ["Not in the single-device fit and check: " + "; ".join(
        f"row {r.index} {r.source} {r.model_label} on {r.hw_label} ({r.scope})" for r in excluded) + ".", ""]


def multi_gpu_lines(csv_path: Path) -> tuple[list[str], list[dict]]:
    """The tp > 1 rows predicted by sim.parallel under their stack's profile (sim.validation.multigpu): held
    out, no fit saw them."""
    from sim.validation import multigpu
    recs = multigpu.report(csv_path)
    if not recs:
        return [], []
    lines = ["Multi-GPU rows (tp > 1; never fitted: held out), predicted by sim.parallel (tensor parallelism over the "
             "device's interconnect) under the stack's profile (`python -m sim.validation.multigpu`):", "",
             "| row | tp | metric | measured | stack profile | predicted | error % | fused error % |",
             "|---|---|---|---|---|---|---|---|"]
    summary = []
    for r in recs:
        if "error" in r:
            lines.append(f"| {r['id']} | {r['tp']} | {r['metric']} | {r['measured']:.4g} | {r['engine']} | "
                         f"not predicted: {r['error']} | - | - |")
        else:
            lines.append(f"| {r['id']} | {r['tp']} | {r['metric']} | {r['measured']:.4g} | {r['engine']} | "
                         f"{r['predicted_stack']:.4g} | {_fmt(r['error_pct_stack'])} | {_fmt(r['error_pct_fused'])} |")
        summary.append({k: (None if isinstance(r.get(k), float) and not np.isfinite(r[k]) else r.get(k))
                        for k in ("id", "tp", "metric", "measured", "engine", "predicted_stack", "error_pct_stack",
                                  "error_pct_fused", "error")})
    errors = [abs(r["error_pct_stack"]) for r in recs if "error" not in r]
    if errors:
        lines += ["", f"Multi-GPU rows: {len(errors)}, MAPE {np.mean(errors):.1f}%, max {max(errors):.1f}%."]
    return lines + [""], summary
