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
# # 2. Design-space exploration: what eviction buys on each device
#
# Reads the table of a `python -m sim.sweep` run (`points.parquet`): the folder named by
# `KVSIM_SWEEP_DIR`, else the newest `results/sweep-*/`. Without one it evaluates a small grid with
# `sim.sweep.evaluate` right here (about a second), so the notebook always runs.
#
# 1. Per device: decode latency and throughput vs cache ratio, one line per policy.
# 2. The roofline chart of one design point, every operator of the prefill and of a decode step
#    placed by its arithmetic intensity (from the engine's operator table).
# 3. Where eviction stops paying: Keyformer-at-50% speedup over full attention across batch x context,
#    with the compute-bound decode region marked.

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
from hwmodels import load_device
from kvcommon.styles import POLICY_STYLES   # the one style per policy, every figure
from sim import engine, sweep
from sim.tradeoff import save_figure

REPO = Path(sim.__file__).resolve().parents[1]
# Figures go to results/figures/; KVSIM_UPDATE_DOCS=1 refreshes the tracked ones the README shows (docs/figures/).
FIGURES = Path(os.environ.get("KVSIM_FIGURES_DIR")
               or REPO / ("docs" if os.environ.get("KVSIM_UPDATE_DOCS") == "1" else "results") / "figures")


def find_sweep_table() -> Path | None:
    if os.environ.get("KVSIM_SWEEP_DIR"):
        path = Path(os.environ["KVSIM_SWEEP_DIR"]) / "points.parquet"
        if not path.exists():
            raise FileNotFoundError(f"KVSIM_SWEEP_DIR has no points.parquet: {path}")
        return path
    candidates = sorted((REPO / "results").glob("sweep-*/points.parquet"), key=lambda p: p.stat().st_mtime)
    return candidates[-1] if candidates else None


NEEDED = {"hw", "model", "policy", "cache_ratio", "batch", "beams", "prompt", "gen", "tpot_s", "max_batch",
          "max_batch_tokens_per_s", "decode_bound"}
source = find_sweep_table()
table = pd.read_parquet(source) if source is not None else None
if table is not None and NEEDED <= set(table.columns):
    print(f"sweep table: {source} ({len(table):,} points)")
else:
    if table is not None:  # e.g. a `--engine des` sweep: serving metrics, not the analytic columns
        print(f"{source} lacks {sorted(NEEDED - set(table.columns))}; evaluating a small grid instead")
    config = sweep.GridConfig(models=["llama-3-8b"], batches=[1, 16, 64], prompts=[4096], gens=[1024])
    points = sweep.build_grid(config)
    table = pd.concat([points, sweep.evaluate(points)], axis=1)
    print(f"evaluated {len(table):,} points here with sim.sweep.evaluate")

# %% [markdown]
# ## 1. Latency and throughput vs cache ratio, per device
#
# One slice of the table: the model `llama-3-8b` when present, the longest prompt and generation, beam
# 1, the `fused` profile. Top: time per output token at the smallest batch. Bottom: tokens/s at the
# largest batch that fits in memory; this is where a smaller cache buys the most, because it lets more
# sequences share one pass over the weights.

# %%
model = "llama-3-8b" if "llama-3-8b" in set(table["model"]) else table["model"].iloc[0]
view = table[(table["model"] == model) & (table["prompt"] == table["prompt"].max())
             & (table["gen"] == table["gen"].max()) & (table["beams"] == table["beams"].min())]
if "profile" in view.columns:
    view = view[view["profile"] == ("fused" if "fused" in set(view["profile"]) else view["profile"].iloc[0])]
smallest_batch = view["batch"].min()
devices = sorted(view["hw"].unique())
prompt, gen = int(view["prompt"].iloc[0]), int(view["gen"].iloc[0])

fig, axes = plt.subplots(2, len(devices), figsize=(2.9 * len(devices), 5.6), squeeze=False)
for col, device in enumerate(devices):
    d = view[view["hw"] == device]
    for policy, st in POLICY_STYLES.items():
        p = d[d["policy"] == policy].sort_values("cache_ratio")
        if p.empty:
            continue
        b1 = p[p["batch"] == smallest_batch].groupby("cache_ratio", as_index=False).first()
        best = p.groupby("cache_ratio", as_index=False)["max_batch_tokens_per_s"].max()
        axes[0, col].plot(b1["cache_ratio"], 1e3 * b1["tpot_s"], color=st.color, ls=st.linestyle, lw=1.4,
                          label=st.label)
        axes[1, col].plot(best["cache_ratio"], best["max_batch_tokens_per_s"], color=st.color, ls=st.linestyle,
                          lw=1.4, label=st.label)
    axes[0, col].set_title(device, fontsize=9)
    axes[1, col].set_xlabel("cache ratio")
    for ax in axes[:, col]:
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=7)
axes[0, 0].set_ylabel(f"ms per token, batch {smallest_batch}")
axes[1, 0].set_ylabel("tokens/s at max batch")
axes[0, 0].legend(fontsize=7)
fig.suptitle(f"{model}, prompt {prompt} + gen {gen}: decode latency and capacity-limited throughput", fontsize=10)
fig.tight_layout()
save_figure(fig, FIGURES / "dse_latency_throughput.png")

# %%
full = view[(view["policy"] == "full") & (view["batch"] == smallest_batch)].groupby("hw").first()
kf = view[(view["policy"] == "keyformer") & (view["batch"] == smallest_batch)
          & np.isclose(view["cache_ratio"], 0.5)].groupby("hw").first()
gains = pd.DataFrame({
    f"TPOT speedup, keyformer 50%, batch {smallest_batch}": full["tpot_s"] / kf["tpot_s"],
    "max batch full": full["max_batch"], "max batch keyformer 50%": kf["max_batch"],
    "throughput gain at max batch": kf["max_batch_tokens_per_s"] / full["max_batch_tokens_per_s"],
}).round(2)
gains

# %% [markdown]
# ## 2. Roofline: every operator of one design point
#
# Each operator of the engine's table (prefill: filled; mean decode step: hollow) sits at its
# arithmetic intensity (FLOPs per byte moved) and its achieved FLOP/s (FLOPs / modelled time). The
# roof is min(peak FLOP/s, bandwidth x intensity) of the device. Decode operators sit on the
# bandwidth slope: that is why cutting the bytes of the KV cache shortens them.

# %%
ROOF_DEVICE = "h100-sxm" if "h100-sxm" in devices else devices[0]
hw = load_device(ROOF_DEVICE)
point = dict(batch=16, prompt=prompt, gen=gen, policy="keyformer", cache_ratio=0.5)
pred = engine.predict(hw, model, point["batch"], point["prompt"], point["gen"], point["policy"], point["cache_ratio"])
ops = pd.concat([pred.prefill_ops.assign(phase="prefill"),
                 pred.decode_ops[pred.decode_ops["step"] == "mean"].assign(phase="decode")], ignore_index=True)
ops = ops[np.isfinite(ops["intensity"]) & (ops["intensity"] > 0) & (ops["time_s"] > 0)].copy()
ops["achieved_flops"] = ops["flops"] / ops["time_s"]

peak = hw.peak_flops("bf16")
intensity = np.logspace(-2, 4, 200)
fig, ax = plt.subplots(figsize=(7.5, 4.8))
ax.plot(intensity, np.minimum(peak, hw.memory_bw * intensity), "k-", lw=1.5, label=f"{ROOF_DEVICE} roof (bf16)")
ax.axvline(peak / hw.memory_bw, color="k", ls=":", lw=0.8)
for phase, marker in (("prefill", "o"), ("decode", "s")):
    sel = ops[ops["phase"] == phase]
    face = None if phase == "prefill" else "none"
    for _, row in sel.iterrows():
        color = "tab:red" if row["op"] in ("attn_scores", "attn_v", "kv_write") else (
            "tab:orange" if row["op"] in ("score_update", "select_evict", "select_topk", "compact") else "tab:blue")
        ax.scatter(row["intensity"], row["achieved_flops"], marker=marker, s=40,
                   facecolors=color if face is None else "none", edgecolors=color)
        ax.annotate(row["op"], (row["intensity"], row["achieved_flops"]), fontsize=6, xytext=(3, 2),
                    textcoords="offset points")
ax.scatter([], [], marker="o", color="grey", label="prefill op")
ax.scatter([], [], marker="s", facecolors="none", edgecolors="grey", label="decode op (mean step)")
ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP / byte)", ylabel="achieved FLOP/s",
       title=f"{model} on {ROOF_DEVICE}: {point['policy']} {point['cache_ratio']:.0%}, batch {point['batch']}, "
             f"{prompt}+{gen} (red: attention/KV, orange: policy)")
ax.title.set_fontsize(9)
ax.grid(alpha=0.3, which="both")
ax.legend(fontsize=7, loc="lower right")
fig.tight_layout()
save_figure(fig, FIGURES / "dse_roofline.png")
ops[["phase", "op", "flops", "intensity", "bound", "time_s"]]

# %% [markdown]
# ## 3. Where eviction stops paying
#
# Keyformer keeping 50% of the prompt's KV vs full attention, prompt = context and generation =
# context / 4, over batch x context. The speedup is the ratio of decode time per token at the *same*
# batch. Hatched cells: the full-attention decode step is compute bound there (the engine's
# `decode_bound`), so fewer KV bytes cannot help much; grey: the full cache does not fit in memory.

# %%
batches = np.array([1, 2, 4, 8, 16, 32, 64, 128, 256, 512])
contexts = np.array([256, 512, 1024, 2048, 4096, 8192, 16384, 32768])
B, C = np.meshgrid(batches, contexts, indexing="ij")
pays_devices = [d for d in ("h100-sxm", "l4") if d in devices] or devices[:2]
pays_rows = []
fig, axes = plt.subplots(1, len(pays_devices), figsize=(5.4 * len(pays_devices), 4.2), squeeze=False)
for ax, device in zip(axes[0], pays_devices):
    hw = load_device(device)
    common = dict(batch=B.ravel(), prompt=C.ravel(), gen=np.maximum(C.ravel() // 4, 1), with_capacity=False)
    full_r = engine.evaluate(hw, model, "full", cache_ratio=1.0, **common)
    kf_r = engine.evaluate(hw, model, "keyformer", cache_ratio=0.5, **common)
    speedup = (full_r["tpot_s"] / kf_r["tpot_s"]).reshape(B.shape)
    compute_bound = (full_r["decode_bound"] == "compute").reshape(B.shape)
    fits = full_r["fits"].reshape(B.shape)
    shown = np.where(fits, speedup, np.nan)
    # Diverging colours centred on 1.0: red cells are where eviction costs more than it saves.
    norm = matplotlib.colors.TwoSlopeNorm(vcenter=1.0, vmin=min(0.99, np.nanmin(shown)),
                                          vmax=max(1.01, np.nanmax(shown)))
    im = ax.pcolormesh(np.arange(len(contexts) + 1), np.arange(len(batches) + 1), shown, cmap="RdYlGn", norm=norm)
    ax.pcolormesh(np.arange(len(contexts) + 1), np.arange(len(batches) + 1),
                  np.where(~fits, 1.0, np.nan), cmap="Greys", vmin=0, vmax=2)
    if np.nanmin(shown) < 1.0 < np.nanmax(shown):
        ax.contour(np.arange(len(contexts)) + 0.5, np.arange(len(batches)) + 0.5, np.where(fits, speedup, 1.0),
                   levels=[1.0], colors="k", linewidths=1.2)
    pays_rows.append({"device": device, "cells that fit": int(fits.sum()),
                      "eviction slower (speedup < 1)": int((shown < 1.0).sum()),
                      "full decode compute bound": int((compute_bound & fits).sum()),
                      "best speedup": float(np.nanmax(shown)), "worst speedup": float(np.nanmin(shown))})
    ax.contourf(np.arange(len(contexts)) + 0.5, np.arange(len(batches)) + 0.5, compute_bound.astype(float),
                levels=[0.5, 1.5], hatches=["///"], colors="none")
    for i in range(len(batches)):
        for j in range(len(contexts)):
            if fits[i, j]:
                ax.text(j + 0.5, i + 0.5, f"{speedup[i, j]:.2f}", ha="center", va="center", fontsize=5.5,
                        color="k")
    ax.set_xticks(np.arange(len(contexts)) + 0.5, [f"{c // 1024}k" if c >= 1024 else str(c) for c in contexts],
                  fontsize=7)
    ax.set_yticks(np.arange(len(batches)) + 0.5, batches, fontsize=7)
    ax.set(xlabel="context (prompt; gen = context / 4)", ylabel="batch", title=f"{device}: keyformer 50% TPOT speedup")
    ax.title.set_fontsize(9)
    fig.colorbar(im, ax=ax, shrink=0.8)
fig.suptitle(f"{model}: black line = break-even, hatched = full-cache decode compute bound, grey = does not fit",
             fontsize=9)
fig.tight_layout()
save_figure(fig, FIGURES / "dse_where_eviction_pays.png")

# %% [markdown]
# Per device: how many (batch, context) cells fit, in how many eviction is slower than the full
# cache (its score and selection work outweighs the KV bytes it saves: short contexts, small
# batches), and in how many the full-cache decode step is compute bound.

# %%
pd.DataFrame(pays_rows).round(3)
