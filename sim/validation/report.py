"""The validation report: Markdown with a parity plot, error statistics, targets, and every point.

Layout (docs/validation.md explains how to read it):
  1. summary and targets (pass/fail, with the numbers);
  2. points above the error threshold, listed first: a large error is never hidden;
  3. MAPE and max error per regime and per source, and per software profile (why each source is
     predicted with the profile it is);
  4. the paper's speedups under hf-eager beside the fused (ideal) profile;
  5. calibration inputs vs validation points (they are disjoint), measurement conditions;
  6. every point.
"""
from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd

from sim.cli import atomic_write_text, atomic_writer
from sim.validation.noise import noise_summary
from sim.validation.points import is_flagged, stats

REGIME_TITLES = {
    "decode-b1": "batch-1 decode (memory-bound)",
    "decode-large-batch": "large-batch decode (KV-bound as batch x context grows)",
    "prefill": "prefill (compute-bound)",
    "eviction-ratio": "eviction ratios (policy vs full)",
    "breakdown": "latency breakdown shares",
    "capacity": "capacity (largest batch that fits)",
}
PLOT_NAME = "validation-parity.png"
SCATTER_HEADER = "round scatter % (prediction within rounds?)"
POINTS_NAME = "validation-points.csv"   # every point, machine-readable (notebooks read it)


def targets(points: pd.DataFrame, threshold: float) -> list[dict]:
    """The issue's targets, evaluated on the points that exist (a target with no points says so)."""
    out = []
    measured = points[(points["kind"] == "measured") & (points["metric"] == "step_latency_s")]
    on_cpu = measured["origin"].astype(str).str.startswith("cpu")
    # the CPU grid: this project's capture (kvsim-eager) under traces/data/cpu/
    cpu_decode = measured[(measured["origin"] == "cpu") & (measured["profile"] == "kvsim-eager")]
    out.append(dict(target="CPU decode-step latency, MAPE <= 10% (on the way to 5%)", limit=10.0,
                    points=len(cpu_decode), value=_mape(cpu_decode), kind="MAPE"))
    speedups = points[(points["kind"] == "reference") & (points["metric"] == "speedup")]
    out.append(dict(target="paper speedup ratios (Table 1 / Figure 9) within 10% under hf-eager", limit=10.0,
                    points=len(speedups), value=_max(speedups), kind="max |error|"))
    hf_cpu = measured[on_cpu & (measured["profile"] == "hf-eager")]
    if len(hf_cpu):   # transformers' generate measured on the CPU (traces.timing --stack hf)
        out.append(dict(target="HF beam-search decode steps on CPU under hf-eager, MAPE <= 10% (kvsim's own check)",
                        limit=10.0, points=len(hf_cpu), value=_mape(hf_cpu), kind="MAPE"))
    gpu_decode = measured[~on_cpu]
    if len(gpu_decode):
        out.append(dict(target="measured GPU decode-step latency, MAPE <= 10%", limit=10.0,
                        points=len(gpu_decode), value=_mape(gpu_decode), kind="MAPE"))
    out.append(dict(target=f"every point within the {threshold:g}% flag threshold", limit=threshold,
                    points=len(points), value=_max(points), kind="max |error|"))
    for t in out:
        t["status"] = "no points" if t["points"] == 0 else ("PASS" if t["value"] <= t["limit"] else "FAIL")
    return out


def _mape(df: pd.DataFrame) -> float:
    return float(df["error_pct"].abs().mean()) if len(df) else float("nan")


def _max(df: pd.DataFrame) -> float:
    return float(df["error_pct"].abs().max()) if len(df) else float("nan")


# ---- plot --------------------------------------------------------------------------------------------

PANELS = (("time (s)", ("step_latency_s", "prefill_s")), ("throughput (tokens/s)", ("tokens_per_s",)),
          ("capacity (requests)", ("max_batch",)),
          ("ratios and shares", ("speedup", "kv_movement_ratio", "kv_time_share", "latency_ratio")))
MARKERS = "o^sDvP*XhpH<>d8"


def parity_plot(points: pd.DataFrame, path: Path, threshold: float) -> None:
    """Predicted vs measured on log axes, one marker per source, y = x and the +-threshold band."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    panels = [(title, points[points["metric"].isin(metrics)]) for title, metrics in PANELS]
    panels = [(t, df) for t, df in panels if len(df)]
    if not panels:
        panels = [("no points", points)]
    sources = list(dict.fromkeys(points["source"]))
    marker = {s: MARKERS[i % len(MARKERS)] for i, s in enumerate(sources)}
    colors = plt.get_cmap("tab10")
    color = {s: colors(i % 10) for i, s in enumerate(sources)}
    ncols = min(2, len(panels))
    nrows = (len(panels) + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.6 * ncols, 4.8 * nrows + 1.0), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
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
        line = np.geomspace(lo, hi, 50)
        ax.plot(line, line, color="black", lw=0.8)
        ax.fill_between(line, line * (1 - threshold / 100), line * (1 + threshold / 100), color="grey", alpha=0.15,
                        label=f"+-{threshold:g}%")
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):   # plain numbers at 1-2-5 steps: readable on short log ranges
            axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            axis.set_minor_formatter(NullFormatter())
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel("measured / published")
        ax.set_ylabel("predicted")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.2)
    handles, labels = [], []
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=7, frameon=False)
    fig.suptitle("kvsim validation: predicted vs measured (red ring: error above threshold)", fontsize=10)
    legend_rows = (len(labels) + 1) // 2
    fig.tight_layout(rect=(0, min(0.4, 0.022 * legend_rows * 2 / nrows + 0.02), 1, 0.97))
    atomic_writer(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png", metadata={"Software": None}))
    plt.close(fig)


# ---- Markdown ----------------------------------------------------------------------------------------

def _fmt(value: float) -> str:
    if value is None or not np.isfinite(value):
        return "n/a"
    a = abs(value)
    if a >= 100:
        return f"{value:.1f}"
    if a >= 1:
        return f"{value:.3g}" if a < 10 else f"{value:.2f}"
    return f"{value:.4g}"


def _table(df: pd.DataFrame, columns: list[tuple[str, str]]) -> str:
    """Markdown table of df with (column, header) pairs; floats formatted compactly."""
    head = "| " + " | ".join(h.replace("|", "\\|") for _, h in columns) + " |"
    sep = "|" + "|".join("---" for _ in columns) + "|"
    lines = [head, sep]
    for _, row in df.iterrows():
        cells = []
        for col, _ in columns:
            v = row[col]
            cells.append(_fmt(float(v)) if isinstance(v, (float, np.floating)) else str(v).replace("|", "\\|"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _stats_table(df: pd.DataFrame, title_map=None) -> str:
    df = df.copy()
    if title_map:
        df["group"] = df["group"].map(lambda g: title_map.get(g, g))
    return _table(df, [("group", "group"), ("points", "points"), ("mape", "MAPE %"), ("max_error", "max |error| %"),
                       ("median_error", "median |error| %"), ("noise_floor", "noise floor %"),
                       ("worst", "worst point")])


def _point_rows(points: pd.DataFrame, threshold: float) -> pd.DataFrame:
    df = points.copy()
    df["flag"] = np.where(is_flagged(df, threshold), "**ABOVE**", "")
    df["error"] = df["error_pct"].map(lambda e: f"{e:+.1f}")
    if "scatter_pct" in df.columns:   # measured points with rounds: error next to the measurement's own scatter
        df["scatter"] = [f"{s:.1f} ({r})" if np.isfinite(s) else "" for s, r in
                         zip(df["scatter_pct"].astype(float), df["in_round_range"])]
    else:
        df["scatter"] = ""
    return df


def profile_comparison(compare: pd.DataFrame, points: pd.DataFrame) -> pd.DataFrame:
    """MAPE per (source kind, regime, profile): the evidence for each source's profile choice."""
    if compare is None or not len(compare):
        return pd.DataFrame()
    source_of = dict(zip(points["id"], points["source"]))
    df = compare.copy()
    df["source"] = df["id"].map(source_of).map(lambda s: s.split("/")[0] if isinstance(s, str) and "/" in s else s)
    df["abs"] = df["error_pct"].abs()
    table = df.pivot_table(index=["source", "regime"], columns="profile", values="abs", aggfunc="mean")
    own = df[df["own"]].groupby(["source", "regime"])["profile"].first()
    table["used"] = own
    return table.reset_index()


def build_markdown(points: pd.DataFrame, compare: pd.DataFrame, sources: list, refs: pd.DataFrame,
                   threshold: float, plot_name: str, hw_notes: list[str]) -> str:
    flagged = points[is_flagged(points, threshold)].sort_values("error_pct", key=lambda e: -e.abs())
    overall = stats(points)
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out = ["# kvsim validation report", "",
           f"Generated by `python -m sim.validate` on {now}. Error % = (predicted - measured) / measured; "
           f"MAPE = mean |error %|. Flag threshold: {threshold:g}% (points above it are listed first and "
           "marked **ABOVE** everywhere). How to read and regenerate this: docs/validation.md.", ""]
    n_ref, n_meas = int((points["kind"] == "reference").sum()), int((points["kind"] == "measured").sum())
    out += ["## Summary", "",
            f"{len(points)} points: {n_ref} published reference values ({refs['file'].nunique() if len(refs) else 0} "
            f"file(s) under sim/references/) and {n_meas} measured points from {len(sources)} timing folder(s) "
            f"under traces/data/. Overall MAPE {_fmt(_mape(points))}%, max |error| {_fmt(_max(points))}%, "
            f"{len(flagged)} point(s) above {threshold:g}%.", ""]
    tg = pd.DataFrame(targets(points, threshold))
    out += ["### Targets", "", _table(tg, [("target", "target"), ("kind", "statistic"), ("points", "points"),
                                             ("value", "value %"), ("limit", "limit %"), ("status", "status")]), ""]
    out += _noise_section(points, threshold)
    out += [f"## Points above {threshold:g}% ({len(flagged)})", ""]
    if len(flagged):
        out += [_table(_point_rows(flagged, threshold), [("source", "source"), ("configuration", "configuration"),
                                                         ("metric", "metric"), ("measured", "measured"),
                                                         ("predicted", "predicted"), ("error", "error %"),
                                                         ("scatter", SCATTER_HEADER), ("profile", "profile")]), ""]
    else:
        out += ["None.", ""]
    out += ["## Error by regime", "", _stats_table(overall, REGIME_TITLES), "",
            "## Error by origin and regime", "", _stats_table(stats(points, ["origin", "regime"])), "",
            "## Error by source", "", _stats_table(stats(points, "source")), "",
            "## Parity plot", "", f"![predicted vs measured]({plot_name})", "",
            "One marker per source, log axes, the black line is y = x and the grey band "
            f"+-{threshold:g}%; red rings mark points above the threshold.", ""]
    comp = profile_comparison(compare, points)
    if len(comp):
        profiles = [c for c in comp.columns if c not in ("source", "regime", "used")]
        out += ["## Software profiles compared", "",
                "MAPE % of the same points predicted under each profile; `used` is the profile the points above "
                "are predicted with (a published point: the stack the paper ran; a timing folder: the code "
                "traces.timing ran, this project's slot cache on eager PyTorch = `kvsim-eager`).", "",
                _table(comp, [("source", "source"), ("regime", "regime")] + [(p, p) for p in profiles]
                       + [("used", "used")]), ""]
    out += _paper_section(points, compare)
    out += _context_slope_section(points, refs)
    out += _provenance_section(sources, refs, hw_notes)
    out += ["## All points", "",
            _table(_point_rows(points, threshold), [("source", "source"), ("configuration", "configuration"),
                                                    ("metric", "metric"), ("regime", "regime"),
                                                    ("measured", "measured"), ("predicted", "predicted"),
                                                    ("error", "error %"), ("scatter", SCATTER_HEADER), ("flag", "flag"),
                                                    ("note", "note")]), ""]
    return "\n".join(out)


def _noise_section(points: pd.DataFrame, threshold: float) -> list[str]:
    """Model error beside the measurement's own noise (sim/validation/noise.py), for points with rounds."""
    rows = noise_summary(points, threshold)
    if not rows:
        return []
    out = ["### Measurement noise", "",
           "Measured points taken in several round-robin rounds (`traces.timing --rounds`) keep their per-round "
           "medians. *Noise floor*: the mean |round value - reported value| / reported value, i.e. the MAPE a "
           "perfect model would score against one round. *Single rounds*: the model's MAPE against each round "
           "alone (how much a MAPE figure moves with the machine's phase). *Within rounds*: points above "
           f"{threshold:g}% whose prediction lies between their lowest and highest round value.", ""]
    df = pd.DataFrame(rows)
    df["rounds"] = df["mape_by_round"].map(lambda v: " / ".join(f"{m:.1f}" for m in v) if v else "n/a")
    df["within"] = [f"{a} of {n}" for a, n in zip(df["above_in_round_range"], df["above"])]
    out += [_table(df, [("origin", "origin"), ("points_of", "points"), ("points", "n"), ("mape", "MAPE %"),
                        ("rounds", "MAPE % against single rounds"), ("noise_floor", "noise floor %"),
                        ("within", f"above {threshold:g}% but within rounds")]), ""]
    return out


def _paper_section(points: pd.DataFrame, compare: pd.DataFrame) -> list[str]:
    refs = points[points["kind"] == "reference"]
    if not len(refs) or compare is None or not len(compare):
        return []
    wide = compare[compare["id"].isin(refs["id"])].pivot_table(index="id", columns="profile", values="predicted",
                                                                aggfunc="first")
    df = refs.set_index("id").join(wide).reset_index()
    cols = [("id", "reference"), ("configuration", "configuration"), ("metric", "metric"), ("measured", "published")]
    cols += [(p, f"{p} predicted") for p in ("hf-eager", "fused", "kvsim-eager") if p in df.columns]
    for p in ("hf-eager", "fused"):
        if p in df.columns:
            df[f"{p}_err"] = ((df[p] - df["measured"]) / df["measured"] * 100).map(lambda e: f"{e:+.1f}")
            cols.append((f"{p}_err", f"{p} error %"))
    return ["## Published references under each profile", "",
            "The paper ran Hugging Face eager code; `hf-eager` models it operator by operator "
            "(sim/profile_hf_eager.py), `fused` is the ideal one-pass roofline. Rows are predicted under the "
            "profile named in their `software` column; the others are shown for comparison.", "",
            _table(df, cols), ""]


SLOPE_KEYS = ["model", "device", "software", "dtype", "batch", "beam", "policy", "cache_ratio"]


def context_slopes(points: pd.DataFrame, refs: pd.DataFrame) -> pd.DataFrame:
    """Per-token time vs prompt length, published and predicted: a least-squares line t = a + b x n
    (ms, n in thousands of prompt tokens) through every group of tokens/s rows that differ only in
    prompt (and gen) length. It splits an absolute error into a fixed per-step part (a) and a part
    that grows with the context (b), which is what a speedup ratio between policies depends on."""
    if not len(refs) or "metric" not in refs.columns:
        return pd.DataFrame()
    rows = refs[refs["metric"] == "tokens_per_s"].merge(points[["id", "predicted"]], on="id")
    out = []
    for key, group in rows.groupby(SLOPE_KEYS, sort=False):
        if group["prompt"].nunique() < 2:
            continue
        n = group["prompt"].to_numpy(float) / 1000.0
        fits = {}
        for side, column in (("published", "value"), ("predicted", "predicted")):
            per_token_ms = 1000.0 / group[column].to_numpy(float) * group["batch"].to_numpy(float)
            fits[side] = np.polyfit(n, per_token_ms, 1)          # (slope b, intercept a)
        label = dict(zip(SLOPE_KEYS, key))
        policy = label["policy"] if label["policy"] == "full" else f"{label['policy']} {float(label['cache_ratio']):g}"
        out.append(dict(group=f"{label['model']} {label['device']} {label['dtype']} b{int(label['batch'])}x"
                              f"{int(label['beam'])}beam {policy}",
                        prompts=" / ".join(str(int(v)) for v in sorted(group["prompt"].unique())),
                        pub_slope=fits["published"][0], pred_slope=fits["predicted"][0],
                        slope_error=(fits["predicted"][0] / fits["published"][0] - 1) * 100,
                        pub_intercept=fits["published"][1], pred_intercept=fits["predicted"][1],
                        weights_floor=_weights_floor_ms(group.iloc[0])))
    return pd.DataFrame(out)


def _weights_floor_ms(row) -> float:
    """One decode step's weight bytes at the device's peak bandwidth (ms): no a can be below it."""
    from sim.models import load_model
    from sim.validation import predict
    device = predict._device(row["device"])
    weights, _ = predict.decode_bytes(device, load_model(row["model"]), int(row["batch"]), 1.0, row["policy"],
                                      row["dtype"], row["software"], beams=int(row["beam"]))
    return weights / device.memory_bw * 1000.0


def _context_slope_section(points: pd.DataFrame, refs: pd.DataFrame) -> list[str]:
    df = context_slopes(points, refs)
    if not len(df):
        return []
    df["slope_err"] = df["slope_error"].map(lambda e: f"{e:+.1f}")
    return ["### Published throughput as a line in the context length", "",
            "Time per generated token (ms, per request) fitted as a + b x prompt (b per 1k prompt tokens) through "
            "the rows that differ only in length, published and predicted. At long prompts a speedup between "
            "two policies tends to the ratio of their b; a mismatch in a matters at short prompts and in the "
            "absolute numbers. The last column is the floor under a: one step's weight bytes at the device's "
            "peak bandwidth.", "",
            _table(df, [("group", "rows"), ("prompts", "prompts"), ("pub_slope", "published b (ms/1k)"),
                        ("pred_slope", "predicted b (ms/1k)"), ("slope_err", "b error %"),
                        ("pub_intercept", "published a (ms)"), ("pred_intercept", "predicted a (ms)"),
                        ("weights_floor", "weights at peak bandwidth (ms)")]), ""]


def _rounds_note(table: pd.DataFrame) -> str:
    """' over R rounds' when traces.timing --rounds revisited the points (folders from before rounds: '')."""
    if "rounds" not in table.columns or table["rounds"].isna().all():
        return ""
    low, high = int(table["rounds"].min()), int(table["rounds"].max())
    rounds = f"{low}" if low == high else f"{low}-{high}"
    return f" over all samples of {rounds} round-robin round(s)"


def _provenance_section(sources: list, refs: pd.DataFrame, hw_notes: list[str]) -> list[str]:
    out = ["## Calibration inputs vs validation points", "",
           "Calibration inputs (what the hardware files were fitted to) and validation points (what they are "
           "tested on) never overlap:", ""]
    out += [f"- {note}" for note in hw_notes] or ["- (no hardware files used)"]
    if len(refs):
        out += [f"- Published points ({len(refs)} rows, sim/references/): predicted on datasheet hardware files; "
                "no number of these papers was used to set any parameter of the hardware files or profiles."]
    out += [""]
    if sources:
        out += ["## Measurement conditions", ""]
        for s in sources:
            m, env = s.manifest, s.manifest.get("env", {})
            t = s.table
            load = t["load_1min"] if "load_1min" in t.columns else pd.Series(dtype=float)
            disturbed = ""
            if "cpu_median_s" in t.columns:
                ratio = (t["median_s"] / t["cpu_median_s"].where(t["cpu_median_s"] > 0)).median()
                disturbed = f"; median wall/thread-CPU time ratio {ratio:.2f} (1.0 = undisturbed)"
            out.append(
                f"- `{s.name}`: {m.get('model', {}).get('name')} ({m.get('model', {}).get('n_params', 0) / 1e6:.0f} M "
                f"params, random weights), {m.get('dtype')}, device {m.get('device')} ({env.get('cpu', env.get('gpu', '?'))}), "
                f"{env.get('threads')} thread(s), OMP_WAIT_POLICY={env.get('omp_wait_policy')}, torch {env.get('torch')}, "
                f"transformers {env.get('transformers')}; {len(t)} points, "
                f"{m.get('grid_settings', {}).get('repeats')} repeats after {m.get('grid_settings', {}).get('warmup')} "
                f"warm-up steps, median{_rounds_note(t)}; load average (1 min) during the points "
                f"{_fmt(load.min()) if len(load) else 'n/a'}-{_fmt(load.max()) if len(load) else 'n/a'}{disturbed}; "
                f"predicted on `{m.get('hw_device')}` with `{s.profile}`.")
        out += [""]
    return out


def write_points(points: pd.DataFrame, path: Path) -> None:
    atomic_writer(path, lambda tmp: points.to_csv(tmp, index=False, float_format="%.6g"))


def write_report(markdown: str, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "validation-report.md"
    atomic_write_text(path, markdown)
    return path
