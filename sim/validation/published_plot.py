"""The published-GPU parity plot (`published-gpu-parity.png` beside the validation report): each row's
prediction against its published value, one panel per metric, filled markers in-sample, hollow markers
leave-one-source-out (the fit that never saw the row's source), crosses for held-out and multi-GPU rows.
The table in the report has the numbers; the plot shows which regimes and sources sit off the diagonal."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from sim.validation.parity_plot import finish, palette, panel_grid, parity_axes

PLOT_NAME = "published-gpu-parity.png"
PANELS = (("out_tok_per_s", "output tokens/s"), ("ttft_ms", "time to first token (ms)"),
          ("e2e_latency_s", "end-to-end latency (s)"), ("tpot_ms", "time per output token (ms)"))
BAND_PCT = 15.0           # the per-regime LOSO target, drawn as the grey band


def parity_plot(table: pd.DataFrame, multi: list[dict], path: Path) -> bool:
    """Write the plot; False (nothing written) when there are no rows to draw."""
    import matplotlib
    matplotlib.use("Agg")

    multi_df = pd.DataFrame([m for m in multi or [] if not m.get("error")])
    panels = []
    for metric, title in PANELS:
        rows = table[table["metric"] == metric] if len(table) else table
        extra = multi_df[multi_df["metric"] == metric] if len(multi_df) else multi_df
        if len(rows) or len(extra):
            panels.append((title, rows, extra))
    if not panels:
        return False
    regimes = sorted(set(table["regime"])) if len(table) else []
    color = palette(regimes)
    fig, axes = panel_grid(len(panels), 4.6)
    for ax, (title, rows, extra) in zip(axes.flat, panels):
        values = [rows["measured"], rows["predicted"], rows["loso"]] if len(rows) else []
        for regime, group in rows.groupby("regime", sort=True) if len(rows) else []:
            trained = group[group["trained"].astype(bool)]
            held = group[~group["trained"].astype(bool)]
            ax.scatter(trained["measured"], trained["predicted"], s=30, color=color[regime], label=f"{regime} in-sample")
            ax.scatter(trained["measured"], trained["loso"], s=42, facecolors="none", edgecolors=color[regime],
                       label=f"{regime} LOSO")
            for m, p, lo in zip(trained["measured"], trained["predicted"], trained["loso"]):
                ax.plot([m, m], [p, lo], color=color[regime], lw=0.6, alpha=0.5)
            if len(held):
                ax.scatter(held["measured"], held["predicted"], marker="x", s=40, color=color[regime],
                           label=f"{regime} held out")
        if len(extra):
            ax.scatter(extra["measured"], extra["predicted_stack"], marker="+", s=70, color="black",
                       label="multi-GPU (held out)")
            values += [extra["measured"], extra["predicted_stack"]]
        flat = np.concatenate([np.asarray(v, float) for v in values]) if values else np.array([1.0])
        flat = flat[np.isfinite(flat) & (flat > 0)]
        lo, hi = flat.min() / 1.4, flat.max() * 1.4
        parity_axes(ax, lo, hi, BAND_PCT, "published", title)
    finish(fig, axes, path, "kvsim engine profiles vs published GPU measurements (line: in-sample to "
           "leave-one-source-out)", ncol=3, legend_scale=0.03, top=0.95)
    return True
