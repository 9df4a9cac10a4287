"""Figures from quality tables (torch-free; matplotlib with the Agg backend).

- `fig7_rouge.png`: the paper's Figure 7 analogue: ROUGE-2 vs cache ratio, one line per policy, the
  full cache and its 99% as horizontal lines (one panel per model x dataset); self-ROUGE-L vs the full
  output beside it. Teacher-forced traces get perplexity ratio and top-1 agreement instead.
- `fig3b_mass.png`: Figure 3b analogue: attention mass retained vs cache ratio, one line per policy.
- `noise_ablation.png`: Table 4 analogue as bars (ROUGE-2 per noise), when the ablation was captured.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from kvcommon.styles import style


def _style(policy: str) -> dict:
    """The project's one style table (kvcommon.styles): colour and marker, solid lines with error bars."""
    s = style(policy)
    return {"color": s.color, "marker": s.marker}


def _panels(quality: pd.DataFrame):
    """One panel per trace folder that sweeps the cache ratio (single-ratio ablation traces are left out)."""
    panels = []
    for (model, dataset, trace), frame in quality.groupby(["model", "dataset", "trace"], sort=True):
        if frame.loc[frame["policy"] != "full", "cache_ratio"].nunique() >= 2:
            panels.append(((model, dataset, trace), frame))
    return panels


def _lines(ax, frame: pd.DataFrame, column: str, full_line: bool = True, pct99: bool = False) -> None:
    """One line per policy with 95% interval bars; the full cache (and its interval) as a band."""
    full = frame[frame["policy"] == "full"]
    shown = [(p, r) for p, r in frame[frame["policy"] != "full"].groupby("policy")
             if "(" not in p and not r[column].isna().all()]  # variants belong to the ablation figure
    for i, (policy, rows) in enumerate(shown):
        # a small horizontal offset per policy keeps overlapping interval bars readable
        rows = rows.sort_values("cache_ratio").assign(cache_ratio=lambda r: r["cache_ratio"] + 0.006 * (i - len(shown) / 2))
        yerr = None
        if f"{column}_lo" in rows:
            yerr = [(rows[column] - rows[f"{column}_lo"]).clip(lower=0), (rows[f"{column}_hi"] - rows[column]).clip(lower=0)]
        ax.errorbar(rows["cache_ratio"], rows[column], yerr=yerr, capsize=2, label=policy, **_style(policy))
    if full_line and not full.empty and not full[column].isna().all():
        value = float(full[column].iloc[0])
        ax.axhline(value, color="black", lw=1.2, label=f"full ({value:.3g})")
        if f"{column}_lo" in full and pd.notna(full[f"{column}_lo"].iloc[0]):
            ax.axhspan(float(full[f"{column}_lo"].iloc[0]), float(full[f"{column}_hi"].iloc[0]), color="black",
                       alpha=0.08, lw=0)
        if pct99:
            ax.axhline(0.99 * value, color="black", lw=1, ls="--", label="99% of full")
    ax.set_xlabel("KV cache kept (fraction of prompt)")
    ax.grid(alpha=0.3)


def _save(fig, path: Path) -> Path:
    from kvcommon.cli import atomic_writer

    fig.tight_layout()
    atomic_writer(path, lambda tmp: fig.savefig(tmp, dpi=110))
    plt.close(fig)
    return path


def _title(frame: pd.DataFrame, trace: str) -> str:
    n, clusters = int(frame["n_samples"].max()), int(frame.get("n_clusters", frame["n_samples"]).max())
    return f"{frame['model'].iloc[0]}: {trace} (n={n}" + (f", {clusters} clusters)" if clusters != n else ")")


def quality_figures(quality: pd.DataFrame, ablation: pd.DataFrame, out: Path,
                    paired: pd.DataFrame | None = None) -> list[Path]:
    out = Path(out)
    written = []
    panels = _panels(quality)
    if not panels:
        return written
    fig, axes = plt.subplots(len(panels), 2, figsize=(11, 3.8 * len(panels)), squeeze=False)
    for row, ((model, dataset, trace), frame) in enumerate(panels):
        left, right = axes[row]
        if "ppl_ratio" in frame and frame["ppl_ratio"].notna().any():
            _lines(left, frame, "ppl_ratio")
            left.set_ylabel("perplexity / full-cache perplexity")
            if "top1_agreement" in frame:
                _lines(right, frame, "top1_agreement", full_line=False)
                right.set_ylabel("top-1 agreement with full cache")
        else:
            _lines(left, frame, "rouge2", pct99=True)
            left.set_ylabel("ROUGE-2 vs reference")
            if "self_rougeL" in frame:
                _lines(right, frame, "self_rougeL", full_line=False)
                right.set_ylabel("ROUGE-L vs full-cache output")
        left.set_title(_title(frame, trace), fontsize=9)
        right.set_title(f"{trace}: fidelity to the full cache", fontsize=9)
        left.legend(fontsize=7)
    written.append(_save(fig, out / "fig7_rouge.png"))

    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    for ax, ((model, dataset, trace), frame) in zip(axes[0], panels):
        _lines(ax, frame, "mass_retained", full_line=False)
        ax.plot([0, 1], [0, 1], color="lightgray", ls=":", label="uniform attention")
        ax.set_ylabel("attention mass retained (favours H2O by construction)")
        ax.set_ylim(0, 1.02)
        ax.set_title(_title(frame, trace), fontsize=9)
        ax.legend(fontsize=7)
    written.append(_save(fig, out / "fig3b_mass.png"))

    if paired is not None and not paired.empty:
        written.append(_paired_figure(paired, out / "paired_keyformer_h2o.png"))

    if not ablation.empty:
        metric = "rouge2" if "rouge2" in ablation and ablation["rouge2"].notna().any() else (
            "ppl" if "ppl" in ablation and ablation["ppl"].notna().any() else "mass_retained")
        groups = list(ablation.groupby(["trace", "cache_ratio"]))
        fig, axes = plt.subplots(1, len(groups), figsize=(4.5 * len(groups), 3.5), squeeze=False)
        order = ["gumbel", "gaussian", "constant", "none"]
        for ax, ((trace, ratio), rows) in zip(axes[0], groups):
            rows = rows.set_index("noise").reindex([o for o in order if o in set(rows["noise"])])
            yerr = None
            if f"{metric}_lo" in rows:
                yerr = [(rows[metric] - rows[f"{metric}_lo"]).clip(lower=0), (rows[f"{metric}_hi"] - rows[metric]).clip(lower=0)]
            ax.bar(rows.index, rows[metric], yerr=yerr, capsize=3,
                   color=["tab:red", "tab:purple", "tab:green", "tab:blue"][:len(rows)])
            ax.set_title(f"{rows['model'].iloc[0]}: {trace} @ {ratio:g} (n={int(rows['n_samples'].max())})", fontsize=8)
            ax.set_ylabel(metric)
        written.append(_save(fig, out / "noise_ablation.png"))
    return written


def _paired_figure(paired: pd.DataFrame, path: Path) -> Path:
    """Keyformer - H2O per cache ratio with 95% intervals, one panel per metric, one line per trace."""
    metrics = [m for m in ("rouge2", "self_rougeL", "mass_retained", "nll") if m in set(paired["metric"])]
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 3.4), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        for trace, rows in paired[paired["metric"] == metric].groupby("trace"):
            rows = rows.sort_values("cache_ratio")
            ax.errorbar(rows["cache_ratio"], rows["difference"],
                        yerr=[rows["difference"] - rows["lo"], rows["hi"] - rows["difference"]], capsize=2,
                        marker="o", ms=3, label=trace)
        ax.axhline(0, color="black", lw=1)
        ax.set_title(f"keyformer - h2o: {metric}", fontsize=9)
        ax.set_xlabel("KV cache kept (fraction of prompt)")
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=6)
    return _save(fig, path)
