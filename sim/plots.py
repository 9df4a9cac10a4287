"""Sweep plots: one small panel per device, one line per policy, a fixed slice of the other axes.

Each figure names its slice (model, batch, prompt + gen) in its title, so a reader never has to guess
which points a line averages: none are averaged, every line is one slice of the table.
"""
from __future__ import annotations

import hashlib
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd

from kvcommon.styles import POLICY_STYLES
from sim.cli import atomic_writer

ENABLED = True
# Rendered PNGs keyed by everything they show (sim.sweep.main sets <cache-dir>/plots; None: always draw).
# Drawing is most of a warm sweep's time (matplotlib: seconds per figure), so an unchanged figure is copied.
CACHE_DIR: Path | None = None
# Policies often coincide (window and streaming move the same bytes; h2o and keyformer differ by the
# noise FLOPs): the one style table (kvcommon.styles) gives each a dash pattern and a marker.


def figure_key(name: str, *frames: pd.DataFrame, **extra) -> str | None:
    """A hash of what a figure shows: its name, the frames it is drawn from (every value and column), the
    extra settings, and the code version (a change to the plotting code re-draws). None when a frame
    cannot be hashed (then the figure is drawn)."""
    from sim.runner import code_version
    h = hashlib.sha256(f"{name}|{sorted((k, repr(v)) for k, v in extra.items())}|{code_version()}".encode())
    try:
        for frame in frames:
            h.update(repr(list(frame.columns)).encode())
            h.update(pd.util.hash_pandas_object(frame, index=False).to_numpy().tobytes())
    except (TypeError, ValueError):
        return None
    return h.hexdigest()[:32]


def cached_png(path, key: str | None, render) -> Path:
    """`render(path)` draws and saves the figure at `path`; with CACHE_DIR and a key, a figure drawn
    before from identical inputs is copied instead (atomically), and a new one is remembered."""
    path = Path(path)
    if CACHE_DIR is None or key is None:
        render(path)
        return path
    stored = Path(CACHE_DIR) / f"{key}{path.suffix or '.png'}"
    if stored.is_file():
        atomic_writer(path, lambda tmp: shutil.copyfile(stored, tmp))
        return path
    render(path)
    try:
        stored.parent.mkdir(parents=True, exist_ok=True)
        atomic_writer(stored, lambda tmp: shutil.copyfile(path, tmp))
    except OSError:      # a read-only cache: the figure is still written
        pass
    return path


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _panels(plt, n: int):
    cols = min(4, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.3 * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def _slice(table: pd.DataFrame, **fixed) -> pd.DataFrame:
    for col, value in fixed.items():
        table = table[table[col] == value]
    return table


def _save(fig, plt, path: Path) -> Path:
    fig.tight_layout()
    atomic_writer(path, lambda p: fig.savefig(p, dpi=110))
    plt.close(fig)
    return path


def _default_slice(table: pd.DataFrame) -> dict:
    """The first model, the longest context, one beam width, the shared dtypes and profile."""
    return dict(model=table["model"].iloc[0], prompt=table["prompt"].max(), gen=table["gen"].max(),
                beams=table["beams"].min(), recent_ratio=table["recent_ratio"].iloc[0],
                kv_dtype=table["kv_dtype"].iloc[0], weight_dtype=table["weight_dtype"].iloc[0],
                profile=table["profile"].iloc[0])


def context_note(t: pd.DataFrame) -> str:
    """' (BEYOND the trained context: what-if)' when the slice's points exceed the model's trained context
    (column exceeds_max_positions), so a plot never shows such a slice unmarked."""
    if "exceeds_max_positions" not in t.columns or t.empty or not t["exceeds_max_positions"].any():
        return ""
    share = "" if t["exceeds_max_positions"].all() else " partly"
    return f" [{share.strip() + ' ' if share else ''}BEYOND the model's trained context: a what-if]"


def _mark_empty(ax, values) -> None:
    """Say why a panel is blank instead of leaving an empty frame."""
    v = np.asarray(values, float)
    if v.size == 0 or not np.any(np.nan_to_num(v) > 0):
        ax.text(0.5, 0.5, "does not fit in memory\nat this slice", transform=ax.transAxes, ha="center",
                va="center", fontsize=8, color="0.4")


def _legend(axes):
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        axes[0].legend(handles, labels, fontsize=7, loc="best")


def _policy_lines_per_device(plt, table: pd.DataFrame, t: pd.DataFrame, rows, x: str, y, xlabel: str, ylabel: str,
                             one_point_per_x: bool = True, log2_x: bool = False):
    """The layout every sweep plot shares: one panel per device of `table`, one line per policy.

    `rows(t, dev)` picks a panel's points from the slice `t`; `y(frame)` is what is drawn, NaN where a
    point does not fit in memory (a gap in the line). `one_point_per_x` keeps the first row at each x:
    axes the slice leaves free (batch, the full policy's rows repeated across cache ratios) would
    otherwise stack copies of the same point.
    """
    devices = list(dict.fromkeys(table["hw"]))
    fig, axes = _panels(plt, len(devices))
    for ax, dev in zip(axes, devices):
        d = rows(t, dev)
        _mark_empty(ax, y(d))
        for policy, st in POLICY_STYLES.items():
            p = d[d["policy"] == policy]
            if one_point_per_x:
                p = p.drop_duplicates(x)
            p = p.sort_values(x)
            if len(p):
                ax.plot(p[x], y(p), **st.line(), ms=4, mfc="none", label=st.label)
        if log2_x:
            ax.set_xscale("log", base=2)
        ax.set_title(dev, fontsize=9)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    _legend(axes)
    return fig


def _device_rows(t: pd.DataFrame, dev: str) -> pd.DataFrame:
    return t[t["hw"] == dev]


def _devices(table: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(table["hw"]))


def latency_vs_cache_ratio(table: pd.DataFrame, path: Path, batch=None) -> Path:
    fixed = _default_slice(table)
    fixed["batch"] = batch if batch is not None else table["batch"].min()
    t = _slice(table, **fixed)
    return cached_png(path, figure_key("latency_vs_cache_ratio", t, devices=_devices(table), fixed=fixed),
                      lambda p: _latency_vs_cache_ratio(table, t, fixed, p))


def _latency_vs_cache_ratio(table, t, fixed, path) -> Path:
    plt = _pyplot()
    # every input is fixed but the ratio, so each ratio is one point already
    fig = _policy_lines_per_device(plt, table, t, _device_rows, "cache_ratio",
                                   lambda f: 1e3 * f["tpot_s"].where(f["fits"]),
                                   "cache ratio (KV budget / prompt)", "mean TPOT (ms)", one_point_per_x=False)
    fig.suptitle(f"Decode latency vs cache ratio (gaps = out of memory): {fixed['model']}, batch {fixed['batch']}, "
                 f"prompt {fixed['prompt']} + gen {fixed['gen']}{context_note(t)}", fontsize=10)
    return _save(fig, plt, path)


def throughput_vs_batch(table: pd.DataFrame, path: Path, ratio: float = 0.5) -> Path:
    fixed = _default_slice(table)
    t = _slice(table, **fixed)
    ratios = np.sort(t["cache_ratio"].unique())
    near = ratios[np.abs(ratios - ratio).argmin()] if len(ratios) else ratio
    return cached_png(path, figure_key("throughput_vs_batch", t, devices=_devices(table), fixed=fixed, near=near),
                      lambda p: _throughput_vs_batch(table, t, fixed, near, p))


def _throughput_vs_batch(table, t, fixed, near, path) -> Path:
    plt = _pyplot()
    fig = _policy_lines_per_device(
        plt, table, t, lambda t, dev: t[(t["hw"] == dev) & ((t["cache_ratio"] == near) | (t["policy"] == "full"))],
        "batch", lambda f: f["tokens_per_s"].where(f["fits"]), "batch (requests)", "tokens/s", log2_x=True)
    fig.suptitle(f"Throughput vs batch (evicting policies at cache ratio {near:g}; gaps = out of memory): "
                 f"{fixed['model']}, prompt {fixed['prompt']} + gen {fixed['gen']}{context_note(t)}", fontsize=10)
    return _save(fig, plt, path)


def max_batch_throughput_vs_cache_ratio(table: pd.DataFrame, path: Path) -> Path:
    fixed = _default_slice(table)
    t = _slice(table, **fixed)
    return cached_png(path, figure_key("max_batch_throughput_vs_cache_ratio", t, devices=_devices(table),
                                       fixed=fixed), lambda p: _max_batch_throughput(table, t, fixed, p))


def _max_batch_throughput(table, t, fixed, path) -> Path:
    plt = _pyplot()
    fig = _policy_lines_per_device(plt, table, t, _device_rows, "cache_ratio", lambda f: f["max_batch_tokens_per_s"],
                                   "cache ratio (KV budget / prompt)", "tokens/s at max batch")
    fig.suptitle(f"Throughput at the largest batch that fits: {fixed['model']}, "
                 f"prompt {fixed['prompt']} + gen {fixed['gen']}{context_note(t)}", fontsize=10)
    return _save(fig, plt, path)


def sweep_plots(table: pd.DataFrame, out_dir: Path) -> list[Path]:
    if not ENABLED or table.empty:
        return []
    out_dir = Path(out_dir)
    return [latency_vs_cache_ratio(table, out_dir / "latency_vs_cache_ratio.png"),
            throughput_vs_batch(table, out_dir / "throughput_vs_batch.png"),
            max_batch_throughput_vs_cache_ratio(table, out_dir / "max_batch_throughput_vs_cache_ratio.png")]
