# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 4. Validation: predicted vs measured
#
# Every validation point pairs a measurement (a published number from `sim/references/*.csv`, or a
# step time this project measured with `python -m traces.timing`, bundled under `traces/data/`) with
# the simulator's prediction for the same configuration. The points are read from a points table of
# `python -m sim.validate` when one exists (the file named by `KVSIM_VALIDATION_POINTS`, else
# `docs/validation-points.csv`); otherwise this notebook collects them here with
# `sim.validation.points.collect`, the same code the report (`docs/validation-report.md`) runs.
#
# A perfect simulator puts every point on the diagonal. The shaded band is +-20%.

# %%
import os
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd

if not os.environ.get("MPLBACKEND"):
    matplotlib.use("Agg")
import matplotlib.pyplot as plt

import sim
from sim.tradeoff import save_figure

REPO = Path(sim.__file__).resolve().parents[1]
# Figures go to results/figures/; KVSIM_UPDATE_DOCS=1 refreshes the tracked ones the README shows (docs/figures/).
FIGURES = Path(os.environ.get("KVSIM_FIGURES_DIR")
               or REPO / ("docs" if os.environ.get("KVSIM_UPDATE_DOCS") == "1" else "results") / "figures")
BAND = 0.20


def find_points_file() -> Path | None:
    if os.environ.get("KVSIM_VALIDATION_POINTS"):
        path = Path(os.environ["KVSIM_VALIDATION_POINTS"])
        if not path.exists():
            raise FileNotFoundError(f"KVSIM_VALIDATION_POINTS: {path} not found")
        return path
    candidates = [REPO / "docs" / "validation-points.csv", REPO / "docs" / "validation" / "points.csv",
                  *sorted([*(REPO / "results").glob("validat*/points.csv"),
                           *(REPO / "results").glob("validate-*/validation-points.csv")],   # sim.validate's default
                          key=lambda p: p.stat().st_mtime, reverse=True)]
    return next((p for p in candidates if p.exists()), None)


source = find_points_file()
if source is not None:
    points = pd.read_csv(source)
    print(f"validation points: {source} ({len(points)} points)")
else:
    from sim.validation import measured
    from sim.validation import points as validation_points
    from sim.validation.references import load_references

    sources = [measured.load_timing(p) for p in measured.find_timing_folders()]
    points, _ = validation_points.collect(load_references(), sources, show_progress=False)
    print(f"no validation report found: collected {len(points)} points here "
          f"({len(sources)} measured timing folder(s) + published references)")
points = points[np.isfinite(points["measured"]) & np.isfinite(points["predicted"])
                & (points["measured"] > 0) & (points["predicted"] > 0)].copy()
points["error_pct"] = 100 * (points["predicted"] / points["measured"] - 1)

# %% [markdown]
# ## Parity plot
#
# One panel per kind of unit (times, throughputs, ratios, capacities): the units differ by orders of magnitude, and a
# ratio near 1 would vanish next to a time of 10^-4 s. Colour = regime (batch-1 decode, large-batch
# decode, prefill, eviction ratios, ...), marker = where the measurement comes from.

# %%
unit = points["unit"].astype(str)
points["panel"] = np.select(
    [unit.str.contains("token", case=False), unit.str.fullmatch(r"s|ms|seconds?", case=False),
     unit.str.contains("request|batch|sequence", case=False)],
    ["throughput", "time", "capacity"], default="ratio")
panels = [p for p in ("time", "throughput", "ratio", "capacity") if p in set(points["panel"])]
regimes = sorted(points["regime"].astype(str).unique())
colors = dict(zip(regimes, plt.cm.tab10.colors))
markers = {"reference": "*", "measured": "o"}

fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4.4), squeeze=False)
for ax, panel in zip(axes[0], panels):
    sel = points[points["panel"] == panel]
    for (regime, kind), group in sel.groupby([sel["regime"].astype(str), sel["kind"].astype(str)]):
        ax.scatter(group["measured"], group["predicted"], s=46 if kind == "reference" else 22, alpha=0.8,
                   marker=markers.get(kind, "x"), color=colors[regime], label=f"{regime} ({kind})")
    lo = min(sel["measured"].min(), sel["predicted"].min()) * 0.8
    hi = max(sel["measured"].max(), sel["predicted"].max()) * 1.25
    line = np.array([lo, hi])
    ax.plot(line, line, "k-", lw=1)
    ax.fill_between(line, line * (1 - BAND), line * (1 + BAND), color="grey", alpha=0.15)
    log = hi / lo > 20
    ax.set(xscale="log" if log else "linear", yscale="log" if log else "linear", xlim=(lo, hi), ylim=(lo, hi),
           xlabel=f"measured ({', '.join(sorted(sel['unit'].astype(str).unique()))})", ylabel="predicted",
           title=f"{panel}: {len(sel)} points, MAPE {sel['error_pct'].abs().mean():.0f}%")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=6, loc="upper left")
fig.suptitle("kvsim validation: predicted vs measured (band: +-20%)", fontsize=10)
fig.tight_layout()
save_figure(fig, FIGURES / "validation_parity.png")

# %% [markdown]
# ## Error by regime
#
# Signed error = (predicted - measured) / measured. MAPE = mean |error|. Nothing is dropped: the
# worst point of each regime is named.

# %%
by_regime = points.groupby("regime").agg(
    points=("error_pct", "size"), mape=("error_pct", lambda e: e.abs().mean()),
    median_signed=("error_pct", "median"), max_abs=("error_pct", lambda e: e.abs().max()))
by_regime["worst"] = points.loc[points.groupby("regime")["error_pct"].apply(lambda e: e.abs().idxmax()), "id"].values
by_regime.round(1)

# %%
points.reindex(points["error_pct"].abs().sort_values(ascending=False).index)[
    ["id", "kind", "regime", "metric", "measured", "predicted", "error_pct", "profile", "hw"]].head(15).round(4)
