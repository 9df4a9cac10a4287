"""The validation's parity plot: predicted vs measured on log axes, one marker per source."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from sim.cli import atomic_writer
from sim.validation.points import is_flagged

PANELS = (("time (s)", ("step_latency_s", "prefill_s")), ("throughput (tokens/s)", ("tokens_per_s",)),
          ("capacity (requests)", ("max_batch",)),
          ("ratios and shares", ("speedup", "kv_movement_ratio", "kv_time_share", "latency_ratio")))
MARKERS = "o^sDvP*XhpH<>d8"


def log_axes(ax, lo: float, hi: float) -> None:
    """Both axes logarithmic over [lo, hi] with plain numbers at 1-2-5 steps (readable on short log ranges)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_minor_formatter(NullFormatter())
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)


def parity_plot(points: pd.DataFrame, path: Path, threshold: float) -> None:
    """Predicted vs measured on log axes, one marker per source, y = x and the +-threshold band."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(title, points[points["metric"].isin(metrics)]) for title, metrics in PANELS]
    panels = [(t, df) for t, df in panels if len(df)]
    if not panels:
        panels = [("no points", points)]
    sources = list(dict.fromkeys(points["source"]))
    marker = {s: MARKERS[i % len(MARKERS)] for i, s in enumerate(sources)}
    color = palette(sources)
    fig, axes = panel_grid(len(panels), 4.8)
    for ax, (title, df) in zip(axes.flat, panels):
        for source, group in df.groupby("source", sort=False):
            flagged = is_flagged(group, threshold)
            ax.scatter(group["measured"], group["predicted"], marker=marker[source], s=28, alpha=0.8,
                       color=color[source], label=source, edgecolors="none")
            if flagged.any():   # ring the points above the threshold so they stand out
                ax.scatter(group["measured"][flagged], group["predicted"][flagged], marker="o", s=90,
                           facecolors="none", edgecolors="red", linewidths=0.9)
        values = np.concatenate([df["measured"].to_numpy(float), df["predicted"].to_numpy(float)])
        values = values[np.isfinite(values) & (values > 0)]
        lo, hi = (values.min() / 1.5, values.max() * 1.5) if len(values) else (0.1, 10)
        parity_axes(ax, lo, hi, threshold, "measured / published", title)
    finish(fig, axes, path, "kvsim validation: predicted vs measured (red ring: error above threshold)", ncol=2,
           legend_scale=0.022, top=0.97)


def palette(keys) -> dict:
    """A tab10 colour per key, in order."""
    import matplotlib.pyplot as plt
    colors = plt.get_cmap("tab10")
    return {k: colors(i % 10) for i, k in enumerate(keys)}


def panel_grid(n: int, panel_height: float):
    """A figure of n panels, two per row (unused cells hidden): (fig, axes array)."""
    import matplotlib.pyplot as plt
    ncols = min(2, n)
    nrows = (n + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.6 * ncols, panel_height * nrows + 1.0), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, axes


def parity_axes(ax, lo: float, hi: float, band_pct: float, xlabel: str, title: str) -> None:
    """y = x, the +-band_pct band, log axes over [lo, hi], labels and grid."""
    line = np.geomspace(lo, hi, 50)
    ax.plot(line, line, color="black", lw=0.8)
    ax.fill_between(line, line * (1 - band_pct / 100), line * (1 + band_pct / 100), color="grey", alpha=0.15,
                    label=f"+-{band_pct:g}%")
    log_axes(ax, lo, hi)
    ax.set(xlabel=xlabel, ylabel="predicted", title=title)
    ax.grid(True, which="both", alpha=0.2)


def finish(fig, axes, path: Path, title: str, ncol: int, legend_scale: float, top: float) -> None:
    """One legend for all panels (each label once) under them, the title, and an atomic PNG write."""
    import matplotlib.pyplot as plt
    handles, labels = [], []
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=7, frameon=False)
    fig.suptitle(title, fontsize=10)
    legend_rows = (len(labels) + ncol - 1) // ncol
    fig.tight_layout(rect=(0, min(0.4, legend_scale * legend_rows * 2 / axes.shape[0] + 0.02), 1, top))
    atomic_writer(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png", metadata={"Software": None}))
    plt.close(fig)

