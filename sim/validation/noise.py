"""Measurement noise beside model error: how much the measured points themselves move between rounds.

`traces.timing --rounds R` measures the whole grid R times round-robin and keeps each point's per-round
medians (`round_medians_s`). Round r of every point of a folder was measured in the same stretch of time,
so the rounds show the machine's drift directly. From them, per measured point:

  round_values   the point's measured value in each round (a step or prefill time; for a policy/full
                 latency ratio, the ratio of the two points' medians in the same round);
  scatter_pct    mean over rounds of |round value - reported value| / reported value * 100: the MAPE a
                 perfect model would score against single rounds (the noise floor of one round);
  in_round_range whether the prediction lies between the lowest and highest round value.

and per group of points: the noise floor (mean scatter) and the MAPE against each single round, which
says how much a MAPE figure itself moves with the machine's phase. Points without rounds (references,
folders measured before --rounds existed) have none of these: NaN / empty, never a guess.
"""
from __future__ import annotations

import numpy as np
import pandas as pd


def parse_rounds(text) -> np.ndarray:
    """Per-round medians as stored by traces.timing (space-separated seconds); empty when absent."""
    if not isinstance(text, str) or not text.strip():
        return np.empty(0)
    try:
        values = np.array([float(v) for v in text.split()])
    except ValueError:
        raise ValueError(f"round_medians_s {text[:40]!r}: not space-separated numbers") from None
    return values if np.all(np.isfinite(values) & (values > 0)) else np.empty(0)


def ratio_rounds(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """Per-round ratio of two points measured in the same rounds (empty unless both have every round)."""
    if len(numerator) < 2 or len(numerator) != len(denominator):
        return np.empty(0)
    return numerator / denominator


def encode(values: np.ndarray) -> str:
    return " ".join(f"{v:.6g}" for v in values)


def point_noise(rounds: np.ndarray, measured: float, predicted: float) -> dict:
    """scatter_pct and in_round_range of one point ({} of NaN / '' when it has fewer than 2 rounds)."""
    if len(rounds) < 2:
        return dict(round_values="", scatter_pct=float("nan"), in_round_range="")
    scatter = float(np.mean(np.abs(rounds - measured)) / measured * 100.0)
    inside = bool(rounds.min() <= predicted <= rounds.max())
    return dict(round_values=encode(rounds), scatter_pct=scatter, in_round_range="yes" if inside else "no")


def noise_floor(points: pd.DataFrame) -> float:
    """Mean scatter over the points that have rounds (NaN when none has)."""
    scatter = points["scatter_pct"].dropna() if "scatter_pct" in points.columns else pd.Series(dtype=float)
    return float(scatter.mean()) if len(scatter) else float("nan")


def mape_by_round(points: pd.DataFrame) -> list[float]:
    """MAPE of the predictions against round r's values, for every round all the points have."""
    if "round_values" not in points.columns or not len(points):
        return []
    rounds = [parse_rounds(t) for t in points["round_values"]]
    n = min((len(r) for r in rounds), default=0)
    if n < 2:
        return []
    values = np.array([r[:n] for r in rounds])                    # points x rounds
    predicted = points["predicted"].to_numpy(float)[:, None]
    return [float(v) for v in np.mean(np.abs(predicted - values) / values, axis=0) * 100.0]


def noise_summary(points: pd.DataFrame, threshold: float) -> list[dict]:
    """Per origin of measured points with rounds, for its decode-step points and for all its points:
    MAPE against the reported values, against each single round, the noise floor, and how many points
    above the threshold have the prediction inside their range of round values."""
    out = []
    if "scatter_pct" not in points.columns:
        return out
    measured = points[(points["kind"] == "measured") & points["scatter_pct"].notna()]
    for origin, group in measured.groupby("origin", sort=False):
        decode = group[group["metric"] == "step_latency_s"]
        for label, subset in (("decode-step latency", decode), ("all measured points", group)):
            if not len(subset) or (subset is group and len(group) == len(decode)):
                continue   # nothing, or the same points as the row before
            above = subset[subset["error_pct"].abs() > threshold]
            out.append(dict(origin=origin, points_of=label, points=len(subset),
                            mape=float(subset["error_pct"].abs().mean()), mape_by_round=mape_by_round(subset),
                            noise_floor=noise_floor(subset), above=len(above),
                            above_in_round_range=int((above["in_round_range"] == "yes").sum())))
    return out
