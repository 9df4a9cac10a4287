"""Validation points: (source, configuration, metric, measured, predicted, error %) rows, and their statistics.

error % = (predicted - measured) / measured * 100 (signed: negative = the simulator is optimistic for a
time, pessimistic for a throughput). MAPE = mean |error %|. A point whose |error %| exceeds the threshold
is flagged, and flagged points are listed first in the report: nothing above the threshold is dropped.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from tqdm import tqdm

from hwmodels.cli import progress_disabled
from sim.models import load_model
from sim.validation import predict
from sim.validation.noise import noise_floor, parse_rounds, point_noise, ratio_rounds
from sim.validation.references import describe, row_runs

POINT_COLUMNS = ("origin", "source", "kind", "id", "configuration", "metric", "unit", "regime", "measured", "predicted",
                 "error_pct", "profile", "hw", "calibration", "note", "round_values", "scatter_pct", "in_round_range")
# Profiles predicted beside each point's own profile, to show what the software stack is worth.
COMPARE_PROFILES = ("fused", "kvsim-eager", "hf-eager")


def _error(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured * 100.0


def _disturbance(t) -> str:
    """Wall / thread-CPU time of a one-thread CPU point: 1.0 when nothing else ran, 2.0 when the point
    got half a core (its wall time is then inflated by other processes, not by its own work)."""
    cpu = t.get("cpu_median_s") if hasattr(t, "get") else None
    threads = t.get("threads") if hasattr(t, "get") else None
    if cpu is None or not np.isfinite(cpu) or cpu <= 0 or threads != 1:
        return ""
    return f"; wall/CPU {t['median_s'] / cpu:.2f}"


def reference_points(refs: pd.DataFrame, progress=None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Points for the published reference rows, each under its own profile; plus a comparison table of
    the same rows under every profile of COMPARE_PROFILES that is not the row's own."""
    rows, compare = [], []
    for _, ref in refs.iterrows():
        run, base = row_runs(ref)
        predicted = predict.reference_value(ref["metric"], run, base)
        source = f"{ref['file'].removesuffix('.csv')}: {ref['where']}"
        rows.append(dict(origin=ref["file"].removesuffix(".csv"), source=source, kind="reference", id=ref["id"], configuration=describe(ref),
                         metric=ref["metric"], unit=ref["unit"], regime=ref["regime"], measured=float(ref["value"]),
                         predicted=predicted, error_pct=_error(predicted, float(ref["value"])),
                         profile=run.profile, hw=run.device,
                         calibration="datasheet file (no calibration against this point)",
                         note=f"{ref['paper']}; {ref['setting']}; {ref['precision']}",
                         **point_noise(np.empty(0), 0.0, 0.0)))
        for profile in COMPARE_PROFILES:
            value = predicted if profile == run.profile else predict.reference_value(ref["metric"], run, base, profile)
            compare.append(dict(id=ref["id"], metric=ref["metric"], regime=ref["regime"], profile=profile,
                                own=profile == run.profile, measured=float(ref["value"]), predicted=value,
                                error_pct=_error(value, float(ref["value"]))))
        if progress is not None:
            progress.update(1)
    return pd.DataFrame(rows, columns=list(POINT_COLUMNS)), pd.DataFrame(compare)


def measured_points(source, progress=None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Points for one timing folder: decode latency, prefill latency, and policy/full latency ratios."""
    model = load_model(source.model_config)
    table = source.table
    own = source.profile
    rows, compare = [], []
    predicted_by_profile: dict[tuple, dict[str, float]] = {}
    rounds: dict[tuple, np.ndarray] = {}     # per-round medians of each point (traces.timing --rounds)
    device = predict._device(source.hw)
    calibration = (f"{device.name}: calibrated from microbenchmarks only; this grid was never an input"
                   if device.calibration else f"{device.name}: datasheet file")
    for _, t in table.iterrows():
        batch, context, policy, ratio = int(t["batch"]), int(t["context"]), str(t["policy"]), float(t["cache_ratio"])
        by_profile = {}
        for profile in dict.fromkeys((own, *COMPARE_PROFILES)):
            if t["phase"] == "decode":
                by_profile[profile] = predict.decode_step_s(source.hw, model, batch, float(t["slots"]), policy,
                                                            source.dtype, profile, beams=source.beams)
            else:
                by_profile[profile] = predict.prefill_s(source.hw, model, batch, context, source.dtype, profile)
        key = (t["phase"], policy, ratio, batch, context)
        predicted_by_profile[key] = by_profile
        label = policy if policy == "full" else f"{policy} {ratio:g}"
        if t["phase"] == "decode":
            w_bytes, kv_bytes = predict.decode_bytes(source.hw, model, batch, float(t["slots"]), policy,
                                                     source.dtype, own, beams=source.beams)
            regime = "decode-b1" if batch == 1 else "decode-large-batch"   # requests, as the references count
            rows_label = f"b{batch}" if source.beams == 1 else f"b{batch}x{source.beams}beam"
            config = (f"{model.name} decode {rows_label} ctx{context} {label} (holds {t['kv_tokens']:.0f}, "
                      f"attends {int(t['slots'])})")
            note = f"KV/weight bytes {kv_bytes / w_bytes:.2f}; p10-p90 {t['p10_s'] * 1e3:.2f}-{t['p90_s'] * 1e3:.2f} ms"
        else:
            regime, config = "prefill", f"{model.name} prefill b{batch} n{context}"
            note = f"p10-p90 {t['p10_s'] * 1e3:.1f}-{t['p90_s'] * 1e3:.1f} ms"
        note += _disturbance(t)
        measured = float(t["median_s"])
        rounds[key] = parse_rounds(t.get("round_medians_s"))
        rows.append(dict(origin=source.origin, source=source.name, kind="measured", id=f"{source.name}/{t['phase']}/{label}/b{batch}/n{context}",
                         configuration=config, metric="step_latency_s" if t["phase"] == "decode" else "prefill_s",
                         unit="s", regime=regime, measured=measured, predicted=by_profile[own],
                         error_pct=_error(by_profile[own], measured), profile=own, hw=source.hw_display,
                         calibration=calibration, note=note, **point_noise(rounds[key], measured, by_profile[own])))
        for profile, value in by_profile.items():
            compare.append(dict(id=rows[-1]["id"], metric=rows[-1]["metric"], regime=regime, profile=profile,
                                own=profile == own, measured=measured, predicted=value,
                                error_pct=_error(value, measured)))
        if progress is not None:
            progress.update(1)
    # Eviction ratios: a policy's step latency over full's at the same batch and context.
    decode = table[table["phase"] == "decode"]
    full = {(int(r["batch"]), int(r["context"])): float(r["median_s"]) for _, r in decode[decode["policy"] == "full"].iterrows()}
    for _, t in decode[decode["policy"] != "full"].iterrows():
        batch, context, policy, ratio = int(t["batch"]), int(t["context"]), str(t["policy"]), float(t["cache_ratio"])
        if (batch, context) not in full:
            continue
        measured = float(t["median_s"]) / full[(batch, context)]
        num = predicted_by_profile[("decode", policy, ratio, batch, context)]
        den = predicted_by_profile[("decode", "full", 1.0, batch, context)]
        per_round = ratio_rounds(rounds[("decode", policy, ratio, batch, context)],
                                 rounds[("decode", "full", 1.0, batch, context)])
        rows.append(dict(origin=source.origin, source=source.name, kind="measured",
                         id=f"{source.name}/ratio/{policy} {ratio:g}/b{batch}/n{context}",
                         configuration=f"{model.name} b{batch} ctx{context} {policy} {ratio:g} / full",
                         metric="latency_ratio", unit="x", regime="eviction-ratio", measured=measured,
                         predicted=num[own] / den[own], error_pct=_error(num[own] / den[own], measured),
                         profile=own, hw=source.hw_display, calibration=calibration,
                         note="step latency of the policy / of full, same batch and context",
                         **point_noise(per_round, measured, num[own] / den[own])))
        for profile in num:
            value = num[profile] / den[profile]
            compare.append(dict(id=rows[-1]["id"], metric="latency_ratio", regime="eviction-ratio", profile=profile,
                                own=profile == own, measured=measured, predicted=value,
                                error_pct=_error(value, measured)))
    return pd.DataFrame(rows, columns=list(POINT_COLUMNS)), pd.DataFrame(compare)


def collect(refs: pd.DataFrame, sources: list, show_progress: bool = True) -> tuple[pd.DataFrame, pd.DataFrame]:
    total = len(refs) + sum(len(s.table) for s in sources)
    points, compare = [], []
    with tqdm(total=total, desc="predicting", unit="pt", disable=progress_disabled(show_progress), leave=False) as bar:
        if len(refs):
            p, c = reference_points(refs, bar)
            points.append(p)
            compare.append(c)
        for source in sources:
            p, c = measured_points(source, bar)
            points.append(p)
            compare.append(c)
    points_df = pd.concat(points, ignore_index=True) if points else pd.DataFrame(columns=list(POINT_COLUMNS))
    compare_df = pd.concat(compare, ignore_index=True) if compare else pd.DataFrame()
    return points_df, compare_df


def stats(points: pd.DataFrame, by: str | list | None = "regime") -> pd.DataFrame:
    """points, MAPE, max |error| (and the point that has it) and the measurement's own noise floor
    (sim/validation/noise.py; NaN for groups without per-round data) per group, plus an 'overall' row."""
    groups = list(points.groupby(by, sort=False)) if by else []
    groups = [(" / ".join(name) if isinstance(name, tuple) else name, g) for name, g in groups]
    groups.append(("overall", points))
    out = []
    for name, group in groups:
        if not len(group):
            continue
        err = group["error_pct"].abs()
        worst = group.loc[err.idxmax()]
        out.append(dict(group=name, points=len(group), mape=float(err.mean()), max_error=float(err.max()),
                        median_error=float(err.median()), noise_floor=noise_floor(group), worst=worst["id"]))
    return pd.DataFrame(out, columns=["group", "points", "mape", "max_error", "median_error", "noise_floor", "worst"])


def is_flagged(points: pd.DataFrame, threshold: float) -> pd.Series:
    return points["error_pct"].abs() > threshold

