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
# # 3. Accuracy vs KV budget, measured on real models, and what it buys
#
# The bundled traces (`traces/data/`) are real runs of real trained models (SmolLM2-135M-Instruct,
# stories260K) with each eviction policy at cache ratios 0.1-1.0. This notebook plots what they
# measured, as the Keyformer paper does for its 6-7B models:
#
# - **Figure 7 analogue**: summary quality (ROUGE against the references) vs cache ratio, one line
#   per policy, with the full cache and 99% of it as horizontal lines;
# - **Figure 3b analogue**: the share of full-cache attention probability that falls on the tokens a
#   policy kept, vs cache ratio;
# - **the trade-off**: each policy x ratio's measured quality against its predicted throughput on each
#   device (the sweep's headline plot), with the Pareto front.
#
# Quality numbers are read from the traces (`quality/quality.csv` written by `python -m traces.quality`,
# and the KV tables); nothing is typed in. Set `KVSIM_TRACE_DIRS` (paths separated by `:`) to plot
# other traces.

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
import traces
from kvcommon.styles import POLICY_STYLES   # the one style per policy, every figure
from sim import sweep, traced, tradeoff
from sim.tradeoff import save_figure

REPO = Path(sim.__file__).resolve().parents[1]
# Figures go to results/figures/; KVSIM_UPDATE_DOCS=1 refreshes the tracked ones the README shows (docs/figures/).
FIGURES = Path(os.environ.get("KVSIM_FIGURES_DIR")
               or REPO / ("docs" if os.environ.get("KVSIM_UPDATE_DOCS") == "1" else "results") / "figures")

if os.environ.get("KVSIM_TRACE_DIRS"):
    trace_dirs = [Path(p) for p in os.environ["KVSIM_TRACE_DIRS"].split(os.pathsep) if p]
else:
    trace_dirs = list(traces.catalog().traces)
if not trace_dirs:
    raise FileNotFoundError("no trace folders: the bundled ones live in traces/data/ (bash traces/data/regenerate.sh "
                            "recaptures them); or set KVSIM_TRACE_DIRS")
loaded = {traced.trace_label(d): traces.load(d) for d in trace_dirs}
quality = pd.concat([tradeoff.measured_quality(t, name) for name, t in loaded.items()], ignore_index=True)
print(f"{len(loaded)} trace(s): " + ", ".join(f"{n} ({tradeoff.trace_model_name(t)}, {len(t.samples)} samples)"
                                             for n, t in loaded.items()))
quality.round(3)

# %% [markdown]
# ## Figure 7 analogue: quality vs cache ratio
#
# Each trace is judged by its headline metric: ROUGE-2 where it was scored against references (the
# paper plots ROUGE-2), top-1 agreement with the full cache for a teacher-forced run, retained
# attention mass otherwise. Only traces that sweep the cache ratio are plotted; single-budget
# ablations (Keyformer's noise, the paper's Table 4) are tabulated below.

# %%
sweeps = [n for n in loaded if quality[(quality["trace"] == n) & (quality["policy"] != "full")]
          .groupby("policy")["cache_ratio"].nunique().max() >= 3]
ablations = [n for n in loaded if n not in sweeps]
if not sweeps:  # only single-budget traces on hand: plot them as they are rather than nothing
    print("no trace sweeps the cache ratio; plotting the single-budget traces")
    sweeps = list(loaded)
# tradeoff.quality_metric: the first of ROUGE-2, ROUGE-L, ..., top-1 agreement, retained mass the trace has
metrics = {n: tradeoff.quality_metric(quality[quality["trace"] == n]) for n in loaded}
fig, axes = plt.subplots(1, len(sweeps), figsize=(5.2 * len(sweeps), 3.8), squeeze=False)
reach_rows = []
for ax, name in zip(axes[0], sweeps):
    q, metric = quality[quality["trace"] == name], metrics[name]
    full_value = q.loc[q["policy"] == "full", metric]
    for policy, st in POLICY_STYLES.items():
        p = q[q["policy"] == policy].sort_values("cache_ratio")
        if p.empty or policy == "full":
            continue
        yerr = ([(p[metric] - p[f"{metric}_lo"]).clip(lower=0), (p[f"{metric}_hi"] - p[metric]).clip(lower=0)]
                if f"{metric}_lo" in p and p[f"{metric}_lo"].notna().any() else None)  # 95% bootstrap intervals
        ax.errorbar(100 * p["cache_ratio"], p[metric], yerr=yerr, ls=st.linestyle, marker=st.marker, ms=3,
                    color=st.color, capsize=2, label=st.label)
        if len(full_value):
            ok = p[p[metric] >= 0.99 * full_value.iloc[0]]
            reach_rows.append({"trace": name, "metric": metric, "policy": policy,
                               "smallest ratio reaching 99% of full": ok["cache_ratio"].min() if len(ok) else np.nan})
    if len(full_value):
        ax.axhline(full_value.iloc[0], color="black", lw=1, label="full cache")
        ax.axhline(0.99 * full_value.iloc[0], color="black", lw=1, ls=":", label="99% of full")
    ax.set(title=f"{name} ({q['trace_model'].iloc[0]})", xlabel="KV cache (% of prompt)", ylabel=metric)
    ax.title.set_fontsize(9)
    ax.grid(alpha=0.3)
axes[0, 0].legend(fontsize=7)
fig.suptitle("Measured quality vs KV budget (bundled real-model traces)", fontsize=10)
fig.tight_layout()
save_figure(fig, FIGURES / "accuracy_vs_budget.png")
pd.DataFrame(reach_rows)

# %% [markdown]
# Single-budget ablations (Table 4 analogue when the trace varies Keyformer's noise):

# %%
quality[quality["trace"].isin(ablations)][["trace", "policy", "cache_ratio", "mass_retained"]
                                          + sorted({metrics[n] for n in ablations} - {"mass_retained"})].round(3)

# %% [markdown]
# ## Figure 3b analogue: attention mass retained
#
# Mean over samples, decode steps, layers and KV heads of the share of the full-cache attention
# probability that the kept tokens carry (measured against a full-cache shadow pass over the same
# tokens), with 95% bootstrap intervals. 1.0 at ratio 1.0 by construction. The measure favours H2O by
# construction: H2O keeps exactly the tokens with the most accumulated attention.

# %%
fig, axes = plt.subplots(1, len(sweeps), figsize=(5.2 * len(sweeps), 3.6), squeeze=False)
for ax, name in zip(axes[0], sweeps):
    q = quality[quality["trace"] == name]
    for policy, st in POLICY_STYLES.items():
        p = q[q["policy"] == policy].sort_values("cache_ratio")
        if not p.empty:
            yerr = ([(p["mass_retained"] - p["mass_retained_lo"]).clip(lower=0),
                     (p["mass_retained_hi"] - p["mass_retained"]).clip(lower=0)]
                    if "mass_retained_lo" in p and p["mass_retained_lo"].notna().any() else None)
            ax.errorbar(100 * p["cache_ratio"], p["mass_retained"], yerr=yerr, ls=st.linestyle, marker=st.marker,
                        ms=3, color=st.color, capsize=2, label=st.label)
    ax.set(title=f"{name} ({q['trace_model'].iloc[0]})", xlabel="KV cache (% of prompt)",
           ylabel="attention mass retained", ylim=(None, 1.01))
    ax.title.set_fontsize(9)
    ax.grid(alpha=0.3)
axes[0, 0].legend(fontsize=7)
fig.suptitle("Attention probability mass on the kept tokens (Figure 3b analogue)", fontsize=10)
fig.tight_layout()
save_figure(fig, FIGURES / "mass_retained.png")

# %% [markdown]
# ## The trade-off: measured quality vs predicted throughput, per device
#
# Each policy x ratio of one trace (SmolLM2 on XSum when bundled: ROUGE-2 against gold summaries, with its
# 95% bootstrap interval) is predicted for the trace's own model and for a 7B-class model (Llama-2-7B), at
# the trace's own prompt and generation lengths, with the trace's per-step KV lengths (`sim.traced`).
# Throughput is tokens/s at the largest batch that fits in the device's memory, where a smaller cache pays
# most. One device per row: points on the black line are the Pareto front (no other setting is both
# faster and better). The quality on the 7B column is the one measured on the small model: the figure
# asks what the same kept fractions would buy there, not what quality a 7B model would reach. The sweep
# (`python -m sim.sweep`) writes the trade-off table for every trace as `tradeoff.parquet`.

# %%
rouge_sweeps = [n for n in sweeps if metrics[n].startswith("rouge")]
pareto_trace = next((n for n in rouge_sweeps if "xsum" in n), (rouge_sweeps or sweeps)[0])
metric = metrics[pareto_trace]
PARETO_DEVICES = ["h100-sxm", "a100-80g-sxm", "l4"]
TARGET = "llama-2-7b"
pareto_dir = next(d for d in trace_dirs if traced.trace_label(d) == pareto_trace)
grid = traced.trace_grid(sweep.GridConfig(hw=PARETO_DEVICES, batches=[1]), [pareto_dir],
                         models=(traced.OWN, TARGET))
joined = tradeoff.join_quality(pd.concat([grid, traced.evaluate(grid)], axis=1), quality)
print(f"predicted {len(grid)} trace-driven points of {pareto_trace} here")
THROUGHPUT = "max_batch_tokens_per_s"
view = joined[(joined["trace"] == pareto_trace) & (joined[THROUGHPUT] > 0)]
own = next(m for m in view["model"].unique() if m != TARGET)
tradeoff.plot_pareto_grid(view, THROUGHPUT, metric, FIGURES / "pareto_quality_throughput.png", rows="hw",
                          cols="model", col_labels={own: f"{view['trace_model'].iloc[0]} (traced)",
                                                    TARGET: f"{TARGET} (same kept fractions)"},
                          title=f"{pareto_trace}: measured {metric} (95% CI) vs predicted throughput at max batch")
front = tradeoff.pareto_front(view, THROUGHPUT, metric, by=["hw", "model"])
front[front["pareto"]][["hw", "model", "policy_label", "cache_ratio", metric, THROUGHPUT, "max_batch"]].sort_values(
    ["hw", "model", THROUGHPUT]).round(3)
