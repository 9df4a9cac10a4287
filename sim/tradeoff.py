"""Quality vs throughput: join what a trace *measured* (ROUGE, retained attention mass) for each
policy x cache ratio with what the simulator *predicts* (latency, throughput) on each device, and find
the Pareto front per device: the trade-off kvsim exists to show.

Quality comes from a real model run (the trace's model); predicted performance comes from the design
point's model fed with that trace's KV lengths. Both are labelled in the joined table (`trace_model`,
`model`) so a plot never passes one model's quality off as another's.
"""
from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from kvcommon.styles import style
from sim.cli import atomic_writer

RATIO_DECIMALS = 4   # cache ratios are matched after rounding (float32 in traces, float64 in grids)
# Preferred headline quality metric, best first; the first present in the joined table is used.
QUALITY_PREFERENCE = ("rouge2", "rougeL", "rouge1", "self_rougeL", "self_rouge2", "top1_agreement",
                      "mass_retained")
# Columns of quality.csv that describe a row rather than measure something.
_ID_COLUMNS = {"policy", "cache_ratio", "sample", "trace", "model", "dataset", "n", "samples", "n_samples", "seed",
               "prompt_len", "recent_ratio"}


def trace_identity(path: str | Path) -> str:
    """Hash of what a trace feeds the simulator: its manifest and its KV-length table (the bytes).

    Part of every trace-driven point's cache key: a recaptured trace invalidates its points. Hashed once
    per process and file state (path, size, mtime): a sweep asks for it per phase and per point."""
    path = Path(path).resolve()
    stats = tuple((f.stat().st_size, f.stat().st_mtime_ns) if f.exists() else None
                  for f in (path / "manifest.json", path / "kv.parquet"))
    return _content_identity(path, stats)


@lru_cache(maxsize=256)
def _content_identity(path: Path, stats: tuple) -> str:
    digest = hashlib.sha256()
    for name in ("manifest.json", "kv.parquet"):
        file = path / name
        if not file.exists():
            raise FileNotFoundError(f"{file}: missing (not a trace folder?)")
        digest.update(name.encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()[:16]


def trace_model_name(trace) -> str:
    model = trace.manifest.get("model", {})
    return str(model.get("name") or model.get("id") or Path(trace.path).name)


def measured_quality(trace, trace_name: str | None = None) -> pd.DataFrame:
    """One row per policy x cache ratio of a trace: mean retained attention mass and kept fraction
    (from its KV table) plus every numeric metric of its quality.csv (mean over samples)."""
    summary = trace.summary()
    summary["cache_ratio"] = summary["cache_ratio"].astype(float).round(RATIO_DECIMALS)
    quality = trace.quality
    if quality is not None and not quality.empty and {"policy", "cache_ratio"} <= set(quality.columns):
        metrics = [c for c in quality.columns if c not in _ID_COLUMNS and not pd.api.types.is_bool_dtype(quality[c])
                   and pd.api.types.is_numeric_dtype(quality[c])]
        q = quality.assign(cache_ratio=quality["cache_ratio"].astype(float).round(RATIO_DECIMALS))
        q = q.groupby(["policy", "cache_ratio"], as_index=False)[metrics].mean()
        summary = summary.merge(q.drop(columns=[c for c in q.columns if c in summary.columns
                                                and c not in ("policy", "cache_ratio")]),
                                on=["policy", "cache_ratio"], how="left")
    summary.insert(0, "trace_model", trace_model_name(trace))
    summary.insert(0, "trace", trace_name or Path(trace.path).name)
    return summary


def join_quality(predictions: pd.DataFrame, quality: pd.DataFrame) -> pd.DataFrame:
    """Predictions (one row per design point, with `trace`, `policy`, `cache_ratio`) joined with the
    measured quality of the same trace, policy and cache ratio.

    The full cache is captured once (its ratio is 1.0) but swept at every ratio; it keeps everything
    whatever the ratio, so all its points take that one measurement."""
    left = predictions.copy()
    left["_ratio"] = left["cache_ratio"].astype(float).round(RATIO_DECIMALS)
    right = quality.rename(columns={"cache_ratio": "_ratio"})
    full = right[right["policy"] == "full"]
    full_one = full.sort_values("_ratio").groupby("trace").tail(1).drop(columns="_ratio")
    joined_evicting = left[left["policy"] != "full"].merge(right, on=["trace", "policy", "_ratio"], how="left",
                                                           suffixes=("", "_measured"))
    joined_full = left[left["policy"] == "full"].merge(full_one, on=["trace", "policy"], how="left",
                                                       suffixes=("", "_measured"))
    order = "_row"
    joined = pd.concat([joined_evicting.assign(**{order: left.index[left["policy"] != "full"]}),
                        joined_full.assign(**{order: left.index[left["policy"] == "full"]})])
    return joined.sort_values(order).drop(columns=[order, "_ratio"]).reset_index(drop=True)


def quality_metric(frame: pd.DataFrame) -> str:
    """The headline quality column present in `frame` (ROUGE-2 first, retained attention mass last)."""
    for name in QUALITY_PREFERENCE:
        if name in frame.columns and frame[name].notna().any():
            return name
    raise ValueError("no quality column (ROUGE or mass_retained) to plot; were the traces scored?")


def pareto_mask(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """True where no other point is at least as good in both x and y and better in one (maximise both).

    NaNs are never on the front. O(n log n): sort by x descending, keep running max of y."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    mask = np.zeros(len(x), bool)
    valid = np.flatnonzero(np.isfinite(x) & np.isfinite(y))
    if valid.size == 0:
        return mask
    # by x descending, then y descending, so ties in x keep only their best y
    order = valid[np.lexsort((-y[valid], -x[valid]))]
    best_y = -np.inf
    for i in order:  # every earlier point has x >= this one's: it is dominated unless its y is higher
        if y[i] > best_y:
            mask[i] = True
            best_y = y[i]
    return mask


def pareto_front(frame: pd.DataFrame, x: str, y: str, by: list[str] | str = "device") -> pd.DataFrame:
    """`frame` with a boolean `pareto` column: on the (x, y) front within each `by` group."""
    by = [by] if isinstance(by, str) else list(by)
    out = frame.copy()
    out["pareto"] = False
    for _, group in out.groupby(by, sort=False):
        out.loc[group.index, "pareto"] = pareto_mask(group[x].to_numpy(), group[y].to_numpy())
    return out


def plot_pareto(frame: pd.DataFrame, x: str, y: str, path: str | Path | None = None, by: str = "device",
                title: str | None = None):
    """One panel per device: every policy x cache ratio as a point, the Pareto front as a line with
    its points labelled by cache ratio."""
    import matplotlib
    if path is not None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import EngFormatter

    data = pareto_front(frame, x, y, by)
    label = "policy_label" if "policy_label" in data.columns else "policy"
    groups = list(data.groupby(by, sort=True))
    cols = min(4, len(groups)) or 1
    rows = -(-len(groups) // cols) or 1
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
    # fixed margins instead of tight_layout: the layout pass costs a full extra render per figure
    fig.subplots_adjust(left=0.06, right=0.98, bottom=0.24 if rows == 1 else 0.14, top=0.86 if title else 0.95,
                        wspace=0.28, hspace=0.42)
    for ax, (name, group) in zip(axes.flat, groups):
        _points(ax, group, x, y, label)
        front = group[group["pareto"]].sort_values(x)
        ax.plot(front[x], front[y], "k-", lw=1, alpha=0.7, label="Pareto front")
        for _, point in front.iterrows():
            if "cache_ratio" in point:
                ax.annotate(f"{point['cache_ratio']:g}", (point[x], point[y]), fontsize=6, xytext=(3, 3),
                            textcoords="offset points")
        finite = group[x][np.isfinite(group[x]) & (group[x] > 0)]
        if len(finite) and finite.max() / finite.min() > 10:
            ax.set_xscale("log")
        else:
            ax.xaxis.set_major_formatter(EngFormatter())
        ax.set_title(str(name), fontsize=10)
        ax.set_xlabel(x.replace("_", " "))
        ax.set_ylabel(y)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(groups):]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 8), fontsize=8, frameon=False)
    if title:
        fig.suptitle(title, fontsize=11)
    if path is not None:
        save_figure(fig, path, dpi=100, tight=False)
        plt.close(fig)
    return fig


def _points(ax, group: pd.DataFrame, x: str, y: str, label: str) -> None:
    """Every policy x ratio as a point; the measured quality's 95% interval as a vertical bar when the
    quality table carries one (`<y>_lo`, `<y>_hi`)."""
    for policy, points in group.groupby(label):
        st = style(policy)       # a variant, `keyformer(noise=...)`, takes its policy's colour
        color, marker = st.color, st.marker
        variant = "(" in str(policy)
        if f"{y}_lo" in points and points[f"{y}_lo"].notna().any():
            ax.errorbar(points[x], points[y], yerr=[(points[y] - points[f"{y}_lo"]).clip(lower=0),
                                                    (points[f"{y}_hi"] - points[y]).clip(lower=0)],
                        fmt="none", ecolor=color, alpha=0.45, lw=0.8, capsize=1.5)
        ax.scatter(points[x], points[y], marker=marker, s=24, alpha=0.8, label=policy,
                   facecolors="none" if variant else color, edgecolors=color)


def plot_pareto_grid(frame: pd.DataFrame, x: str, y: str, path: str | Path, rows: str = "hw", cols: str = "model",
                     col_labels: dict | None = None, title: str | None = None):
    """One device per row, one target model per column (the traced model, a 7B-class model): measured
    quality with its interval against predicted throughput, the front per panel."""
    import matplotlib
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    row_keys = sorted(frame[rows].unique())
    col_keys = list(dict.fromkeys(frame[cols]))
    label = "policy_label" if "policy_label" in frame.columns else "policy"
    fig, axes = plt.subplots(len(row_keys), len(col_keys), figsize=(5.0 * len(col_keys), 3.2 * len(row_keys)),
                             squeeze=False)
    for i, row_key in enumerate(row_keys):
        for j, col_key in enumerate(col_keys):
            ax = axes[i, j]
            group = frame[(frame[rows] == row_key) & (frame[cols] == col_key)]
            if group.empty:
                ax.axis("off")
                continue
            group = pareto_front(group, x, y, by=[rows, cols])
            _points(ax, group, x, y, label)
            front = group[group["pareto"]].sort_values(x)
            ax.plot(front[x], front[y], "k-", lw=1, alpha=0.7, label="Pareto front")
            for _, point in front.iterrows():
                ax.annotate(f"{point['cache_ratio']:g}", (point[x], point[y]), fontsize=6, xytext=(3, 3),
                            textcoords="offset points")
            name = (col_labels or {}).get(col_key, str(col_key))
            ax.set_title(f"{row_key}: {name}", fontsize=9)
            ax.set_xlabel(x.replace("_", " "), fontsize=8)
            ax.set_ylabel(f"{y} (95% CI)", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 8), fontsize=8, frameon=False)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.05, 1, 0.95 if title else 1))
    save_figure(fig, path, dpi=100, tight=False)
    plt.close(fig)
    return path


def save_figure(fig, path: str | Path, dpi: int = 110, tight: bool = True) -> Path:
    """PNG written atomically (a reader never sees half a file). `tight=False` skips the bounding-box
    pass (a second render) for figures already laid out with tight_layout."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_writer(path, lambda tmp: fig.savefig(tmp, dpi=dpi, format=path.suffix.lstrip(".") or "png",
                                                bbox_inches="tight" if tight else None))
    return path


def _fmt_rate(x: float) -> str:
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.3g}"


def _model_names(models: pd.Series) -> list[str]:
    """Model cells as people read them: `trace:/path/to/trace` (a trace's own model) -> `trace's own model`."""
    return sorted({"the trace's own model" if str(m).startswith("trace:") else str(m) for m in models.unique()})


def write_tradeoff(joined: pd.DataFrame, out_dir: str | Path, throughput: str, plots: bool = True) -> list[str]:
    """tradeoff.parquet / .csv (every trace-driven point with its measured quality and a `pareto`
    flag per trace x device) and one `pareto_<trace>.png` per trace; returns the summary's section.

    Each trace is judged by its own headline metric (ROUGE-2 for summaries; top-1 agreement for a
    teacher-forced run; retained attention mass when a trace was not scored)."""
    from sim.cli import atomic_writer
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    by = "hw" if "hw" in joined.columns else "device"
    parts, lines = [], ["## Quality vs throughput (trace-driven)", "",
                        f"Quality is what each trace measured on its real model; throughput (`{throughput}`) is "
                        "predicted from the trace's own per-step, per-layer KV lengths. Pareto front per device "
                        "(no other setting is both faster and better), fastest last:", ""]
    for trace, group in joined.groupby("trace", sort=True):
        try:
            metric = quality_metric(group)
        except ValueError:      # an unscored trace (or variant): its rows are kept, there is no front
            parts.append(group.assign(quality_metric=None, pareto=False))
            lines += [f"### {trace}", "", "Not scored: no quality column (run `python -m traces.quality` on "
                      "the trace folder); its points are in tradeoff.csv without a front.", ""]
            continue
        usable = group[np.isfinite(group[throughput].astype(float)) & (group[throughput].astype(float) > 0)]
        flagged = pareto_front(usable, throughput, metric, by=by) if len(usable) else usable.assign(pareto=False)
        parts.append(group.assign(quality_metric=metric, pareto=flagged["pareto"].reindex(group.index, fill_value=False)))
        label = "policy_label" if "policy_label" in group.columns else "policy"
        lines += [f"### {trace} ({metric}; quality measured on {group['trace_model'].iloc[0]}, "
                  f"throughput predicted for {', '.join(_model_names(group['model']))})", "",
                  f"| {by} | Pareto front: policy@ratio ({metric}, tokens/s) |", "|---|---|"]
        for device, dev in flagged[flagged["pareto"]].groupby(by, sort=True):
            front = dev.sort_values(throughput)
            cells = "; ".join(f"{r[label]}@{r['cache_ratio']:g} ({r[metric]:.3g}, {_fmt_rate(r[throughput])})"
                              for _, r in front.iterrows())
            lines.append(f"| {device} | {cells} |")
        lines.append("")
        sweeps_ratio = group[group["policy"] != "full"].groupby(label)["cache_ratio"].nunique().max() >= 3
        if plots and len(usable) and sweeps_ratio:  # a single-budget ablation has no front worth a figure
            name = "pareto_" + str(trace).replace("/", "_") + ".png"
            title = f"{trace}: measured {metric} vs predicted {throughput.replace('_', ' ')}"
            from sim.plots import cached_png, figure_key   # an unchanged figure is copied, not drawn again
            cached_png(out_dir / name, figure_key("pareto", usable, x=throughput, y=metric, by=by, title=title),
                       lambda p: plot_pareto(usable, throughput, metric, p, by=by, title=title))
            lines += [f"Plot: `{name}`", ""]
    table = pd.concat(parts) if parts else joined.assign(pareto=False)
    for name, write in (("tradeoff.parquet", lambda p: table.to_parquet(p, index=False)),
                        ("tradeoff.csv", lambda p: table.to_csv(p, index=False))):
        atomic_writer(out_dir / name, write)
    return lines
