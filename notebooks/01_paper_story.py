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
# # 1. The Keyformer paper's performance story, predicted
#
# The Keyformer paper (Adnan et al., MLSys 2024) argues three things about MPT-7B on an A100:
#
# 1. **Figure 1**: KV-cache data movement is a large and growing share of generation latency as the
#    sequence grows (about 40% at 8k tokens, batch 1, beam 4).
# 2. **Figure 9 / Table 1**: evicting KV (H2O at 90%, Keyformer at 50%) speeds generation up by
#    1.1-2.1x, more the longer the sequence.
# 3. **Figure 10**: the gain comes from moving less KV data (KV time 0.35-0.41x of Full), not from
#    cheaper attention arithmetic, and Keyformer's Gumbel score costs a little on top.
#
# This notebook recomputes each figure with `sim.engine` for two software stacks: `fused` (ideal
# kernels: one pass over the weights and the kept KV per step) and `hf-eager` (the paper's stack:
# Hugging Face eager attention, `torch.cat` cache growth and beam-search cache reordering, written
# down as explicit operators in `sim/profiles/hf_eager.py`). Paper numbers come from
# `sim/references/keyformer_mlsys24.csv`; every predicted number here is computed below, nothing is
# typed in.

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
from kvcommon.styles import style   # the one style per policy, every figure
from sim import engine
from sim.models import load_model
from sim.tradeoff import save_figure
from sim.validation.predict import request_kv_movement_s

REPO = Path(sim.__file__).resolve().parents[1]
# Figures go to results/figures/; KVSIM_UPDATE_DOCS=1 refreshes the tracked ones the README shows (docs/figures/).
FIGURES = Path(os.environ.get("KVSIM_FIGURES_DIR")
               or REPO / ("docs" if os.environ.get("KVSIM_UPDATE_DOCS") == "1" else "results") / "figures")
REFERENCES = pd.read_csv(REPO / "sim" / "references" / "keyformer_mlsys24.csv")

DEVICE = load_device("a100-80g-sxm")   # the paper: A100 (80 GB assumed, see shared/docs §3.1)
MODEL = load_model("mpt-7b")
BEAMS = 4                              # "beam size of 4" in all the paper's evaluations
PROFILES = ("fused", "hf-eager")
pd.set_option("display.precision", 3)

# %% [markdown]
# ## KV data-movement time
#
# For every operator of a step the engine reports the bytes it moves by kind (weights, activations,
# KV read, KV written) and its modelled time. The *KV data-movement time* of an operator is its time
# times the KV share of its bytes; cache copies (concatenation, beam reorder, compaction) are all
# KV. Over a request it is the prefill's plus (gen - 1) mean decode steps'. This is the definition
# the validation report uses (`sim.validation.predict.request_kv_movement_s`), so the numbers here
# and there agree.

# %%
def request_breakdown(p: engine.Prediction) -> dict:
    """Seconds per request: total, KV movement, attention arithmetic, eviction-policy overhead."""
    mean = p.decode_ops[p.decode_ops["step"] == "mean"]
    steps = p.inputs["gen"] - 1
    attention = ["attn_scores", "softmax", "attn_v"]
    policy_ops = ["score_update", "select_evict", "select_topk", "compact", "policy_eager_passes",
                  "evict_compact"]

    def op_time(table, names):
        return float(table.loc[table["op"].isin(names), "time_s"].sum())

    return {
        "e2e_s": p.e2e_s,
        "kv_movement_s": request_kv_movement_s(p),
        "attention_s": op_time(p.prefill_ops, attention) + steps * op_time(mean, attention),
        "policy_overhead_s": op_time(p.prefill_ops, policy_ops) + steps * op_time(mean, policy_ops),
    }


# %% [markdown]
# ## Figure 1: latency and the KV share of it vs sequence length
#
# MPT-7B, fp16, batch 1 x beam 4, half prompt and half generation, full cache.

# %%
lengths = [512, 1024, 2048, 4096, 8192, 16384]
rows = []
for profile in PROFILES:
    for length in lengths:
        n = length // 2
        p = engine.predict(DEVICE, MODEL, 1, n, n, "full", 1.0, beams=BEAMS, kv_dtype="fp16",
                           weight_dtype="fp16", profile=profile)
        rows.append({"profile": profile, "sequence": length, **request_breakdown(p),
                     "kv_cache_gib": p.extra["kv_bytes_per_token"] * BEAMS * length / 2**30})
fig1 = pd.DataFrame(rows)
fig1["latency_vs_512"] = fig1["e2e_s"] / fig1.groupby("profile")["e2e_s"].transform("first")
fig1["kv_share"] = fig1["kv_movement_s"] / fig1["e2e_s"]
paper_share = REFERENCES.loc[REFERENCES["metric"] == "kv_time_share", "value"].item()
fig1[["profile", "sequence", "e2e_s", "latency_vs_512", "kv_share", "kv_cache_gib"]]

# %%
fig, (ax_lat, ax_share) = plt.subplots(1, 2, figsize=(10, 3.6))
for profile, group in fig1.groupby("profile"):
    ax_lat.plot(group["sequence"], group["latency_vs_512"], "o-", label=profile)
    ax_share.plot(group["sequence"], 100 * group["kv_share"], "o-", label=profile)
ax_lat.set(xscale="log", yscale="log", xlabel="sequence length (prompt + generation)",
           ylabel="latency / latency at 512", title="Latency growth (paper: >50x from 512 to 8k)")
ax_share.axhline(100 * paper_share, color="k", ls=":", label=f"paper: ~{paper_share:.0%} at 8k")
ax_share.set(xscale="log", xlabel="sequence length", ylabel="KV data movement, % of latency",
             title="KV share of latency (Figure 1)")
for ax in (ax_lat, ax_share):
    ax.set_xticks(lengths, [f"{n // 1024}k" if n >= 1024 else str(n) for n in lengths])
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
fig.suptitle("MPT-7B on A100-80GB, fp16, batch 1 x beam 4 (kvsim prediction)", fontsize=10)
fig.tight_layout()
save_figure(fig, FIGURES / "paper_fig1_kv_share.png")

# %% [markdown]
# ## Figure 9 and Table 1: speedup and throughput vs cache ratio
#
# The paper's configuration (reference CSV): fp32 weights and KV, batch 1, beam 4, prompt = generation
# = 1k, 2k, 4k tokens. Speedup is per-token latency of Full over the policy's (the paper's Figure 9
# equals its Table 1 throughput ratios). We sweep the cache ratio for H2O and Keyformer; the paper
# measured H2O at 90% and Keyformer at 50%.

# %%
ratios = np.round(np.arange(0.1, 1.01, 0.1), 2)
sizes = [1024, 2048, 4096]
rows = []
for profile in PROFILES:
    for n in sizes:
        common = dict(batch=1, prompt=n, gen=n, beams=BEAMS, kv_dtype="fp32", weight_dtype="fp32",
                      profile=profile, with_capacity=False)
        full = engine.evaluate(DEVICE, MODEL, "full", cache_ratio=1.0, **common)
        for policy in ("h2o", "keyformer"):
            out = engine.evaluate(DEVICE, MODEL, policy, cache_ratio=ratios, **common)
            rows += [{"profile": profile, "n": n, "policy": policy, "cache_ratio": r,
                      "speedup": full["tpot_s"][0] / out["tpot_s"][i], "tokens_per_s": out["tokens_per_s"][i],
                      "full_tokens_per_s": full["tokens_per_s"][0]} for i, r in enumerate(ratios)]
fig9 = pd.DataFrame(rows)

# %%
paper_speedup = REFERENCES[REFERENCES["metric"] == "speedup"].query("batch == 1")
fig, axes = plt.subplots(1, len(sizes), figsize=(12, 3.6), sharey=True)
styles = {"fused": "-", "hf-eager": "--"}
for ax, n in zip(axes, sizes):
    for (profile, policy), group in fig9[fig9["n"] == n].groupby(["profile", "policy"]):
        ax.plot(group["cache_ratio"], group["speedup"], styles[profile], color=style(policy).color,
                label=f"{policy} ({profile})")
    for _, ref in paper_speedup[paper_speedup["prompt"] == n].iterrows():
        ax.plot(ref["cache_ratio"], ref["value"], "*", ms=12, color=style(ref["policy"]).color, mec="k")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set(title=f"{n}+{n} tokens", xlabel="cache ratio (kept / prompt)")
    ax.grid(alpha=0.3)
axes[0].set_ylabel("latency speedup over Full")
axes[0].legend(fontsize=7, title="stars: paper (Fig. 9)", title_fontsize=7)
fig.suptitle("MPT-7B on A100-80GB, fp32, batch 1 x beam 4: speedup vs cache ratio", fontsize=10)
fig.tight_layout()
save_figure(fig, FIGURES / "paper_fig9_speedup.png")

# %% [markdown]
# Table 1 side by side: the paper's measured tokens/s and the two stacks' predictions at the
# paper's own settings (H2O 90%, Keyformer 50%; the last row doubles the batch).

# %%
table1_refs = REFERENCES[(REFERENCES["metric"] == "tokens_per_s")]
rows = []
for _, ref in table1_refs.iterrows():
    row = {"prompt+gen": f"{ref['prompt']}+{ref['gen']}", "batch": int(ref["batch"]), "policy": ref["policy"],
           "cache_ratio": ref["cache_ratio"], "paper_tokens_per_s": ref["value"]}
    for profile in PROFILES:
        out = engine.evaluate(DEVICE, MODEL, ref["policy"], batch=ref["batch"], prompt=ref["prompt"], gen=ref["gen"],
                              cache_ratio=ref["cache_ratio"], beams=ref["beam"], kv_dtype=ref["dtype"],
                              weight_dtype=ref["dtype"], profile=profile, with_capacity=False)
        row[f"{profile}_tokens_per_s"] = out["tokens_per_s"][0]
    rows.append(row)
table1 = pd.DataFrame(rows)
for profile in PROFILES:
    table1[f"{profile}_error_%"] = 100 * (table1[f"{profile}_tokens_per_s"] / table1["paper_tokens_per_s"] - 1)
table1

# %% [markdown]
# ## Figure 10: where Keyformer's time goes, normalised to Full
#
# Keyformer at 50% vs Full, prompt = generation = 512 ... 4k, the paper's fp32 stack. Three ratios per
# length, as in the paper: KV data-movement time (Keyformer / Full), the eviction policy's own
# operators (score update, selection, compaction; the paper's "Gumbel softmax overhead") in units of
# Full's KV time, and attention arithmetic (QK^T, softmax, x V) time (Keyformer / Full).

# %%
rows = []
for profile in PROFILES:
    for n in [512, 1024, 2048, 4096]:
        kw = dict(beams=BEAMS, kv_dtype="fp32", weight_dtype="fp32", profile=profile)
        full = request_breakdown(engine.predict(DEVICE, MODEL, 1, n, n, "full", 1.0, **kw))
        kf = request_breakdown(engine.predict(DEVICE, MODEL, 1, n, n, "keyformer", 0.5, **kw))
        rows.append({"profile": profile, "n": n,
                     "kv_movement": kf["kv_movement_s"] / full["kv_movement_s"],
                     "policy_overhead": kf["policy_overhead_s"] / full["kv_movement_s"],
                     "attention": kf["attention_s"] / full["attention_s"]})
fig10 = pd.DataFrame(rows)
paper_kv = REFERENCES[REFERENCES["metric"] == "kv_movement_ratio"].set_index("prompt")["value"]
fig10["paper_kv_movement"] = fig10["n"].map(paper_kv)
fig10

# %%
fig, axes = plt.subplots(1, len(PROFILES), figsize=(11, 3.6), sharey=True)
x = np.arange(4)
for ax, (profile, group) in zip(axes, fig10.groupby("profile")):
    ax.bar(x - 0.2, group["kv_movement"], 0.4, label="KV data movement", color="tab:red")
    ax.bar(x - 0.2, group["policy_overhead"], 0.4, bottom=group["kv_movement"], color="tab:orange",
           label="+ eviction-policy overhead")
    ax.bar(x + 0.2, group["attention"], 0.4, label="attention arithmetic", color="tab:grey")
    ax.plot(x - 0.2, group["paper_kv_movement"], "k*", ms=10, label="paper: KV movement")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(1 / 3, color="k", lw=0.8, ls=":", label="ideal 0.5n / 1.5n = 1/3")
    ax.set_xticks(x, ["512", "1k", "2k", "4k"])
    ax.set(title=f"{profile}", xlabel="prompt = generation")
    ax.grid(alpha=0.3, axis="y")
axes[0].set_ylabel("Keyformer 50% / Full")
axes[-1].legend(fontsize=7)
fig.suptitle("Figure 10 analogue: MPT-7B, Keyformer 50% KV vs Full, A100-80GB fp32 (kvsim)", fontsize=10)
fig.tight_layout()
save_figure(fig, FIGURES / "paper_fig10_breakdown.png")

# %% [markdown]
# ## What this shows
#
# Computed from the tables above (rerun the notebook after changing a device file or profile and
# the sentences follow the numbers):

# %%
share8k = fig1[fig1["sequence"] == 8192].set_index("profile")["kv_share"]
growth = fig1[fig1["sequence"] == 8192].set_index("profile")["latency_vs_512"]
kf4k = fig9.query("n == 4096 and policy == 'keyformer' and cache_ratio == 0.5").set_index("profile")["speedup"]
h2o4k = fig9.query("n == 4096 and policy == 'h2o' and cache_ratio == 0.9").set_index("profile")["speedup"]
kv4k = fig10[fig10["n"] == 4096].set_index("profile")["kv_movement"]
paper = REFERENCES.set_index("id")["value"]
for profile in PROFILES:
    print(f"{profile:>9}: KV share of latency at 8k {share8k[profile]:.0%} (paper ~{paper_share:.0%}); "
          f"latency 512 -> 8k x{growth[profile]:.0f} (paper >50); "
          f"4k+4k speedup Keyformer 50% {kf4k[profile]:.2f}x (paper {paper['f9-kf-4k']:.2f}x), "
          f"H2O 90% {h2o4k[profile]:.2f}x (paper {paper['f9-h2o-4k']:.2f}x); "
          f"KV movement Keyformer/Full at 4k {kv4k[profile]:.3f} (paper {paper['f10-kv-4k']:.3f}, ideal 0.333)")
