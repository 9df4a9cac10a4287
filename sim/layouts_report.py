"""What per-head eviction frees in each KV layout, from real traces' kept positions: a table (markdown and
CSV) and a figure, for the docs and the sweep summary (sim.layouts does the block accounting).

The freed share of a (policy, cache ratio, layout) is 1 - paid slots / the full cache's tokens (n + s + 1
after decode step s), averaged over decode steps, layers and KV heads per sample; the figure and table give
its mean over samples with a 95% percentile bootstrap over sample clusters (traces.stats: the cut points of
one TinyStories story move together), and the number of samples and clusters.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from sim.layouts import LAYOUTS, Layout, layout_tables
from traces.stats import bootstrap, cluster_of

FIGURE_NAME = "kv_freed_by_layout.png"


def per_sample_freed(table: pd.DataFrame) -> pd.DataFrame:
    """(policy, cache_ratio, sample) -> freed share, from one layout's table (sim.layouts.layout_tables)."""
    d = table[table["step"] >= 0]
    full = d["prompt_len"] + d["step"] + 1
    d = d.assign(freed=1.0 - np.minimum(d["kv_len"], full) / full)
    return d.groupby(["policy", "cache_ratio", "sample"], as_index=False)["freed"].mean()


def freed_table(traces: dict, layouts: list[Layout], policies=None) -> pd.DataFrame:
    """One row per trace (its model), policy, cache ratio and layout: freed share mean, 95% interval,
    samples and clusters."""
    rows = []
    for model, trace in traces.items():
        for layout, table in layout_tables(trace, layouts, policies).items():
            for (policy, ratio), part in per_sample_freed(table).groupby(["policy", "cache_ratio"]):
                ci = bootstrap(part["freed"].to_numpy(), [cluster_of(s) for s in part["sample"]])
                rows.append(dict(model=model, policy=policy, cache_ratio=round(float(ratio), 4), layout=layout.name,
                                 block_size=layout.block_size, compact_every=layout.compact_every or 0,
                                 freed_share=ci.mean, freed_lo=ci.lo, freed_hi=ci.hi, samples=len(part),
                                 clusters=len({cluster_of(s) for s in part["sample"]})))
    return pd.DataFrame(rows)


def markdown(table: pd.DataFrame) -> str:
    """One line per model, policy and ratio; one column per layout: freed % [95% interval]."""
    lines = ["| model | policy | cache ratio | " + " | ".join(_label(r) for r in _layout_keys(table)) +
             " | samples (clusters) |", "|---|---|---|" + "---|" * len(_layout_keys(table)) + "---|"]
    for (model, policy, ratio), part in table.groupby(["model", "policy", "cache_ratio"], sort=True):
        cells = []
        for key in _layout_keys(table):
            row = part[(part["layout"] == key[0]) & (part["block_size"] == key[1]) & (part["compact_every"] == key[2])]
            cells.append("-" if row.empty else
                         f"{100 * row['freed_share'].iloc[0]:.1f} [{100 * row['freed_lo'].iloc[0]:.1f}, "
                         f"{100 * row['freed_hi'].iloc[0]:.1f}]")
        first = part.iloc[0]
        lines.append(f"| {model} | {policy} | {ratio:g} | " + " | ".join(cells) +
                     f" | {first['samples']} ({first['clusters']}) |")
    return "\n".join(lines)


def _layout_keys(table: pd.DataFrame) -> list[tuple]:
    keys = table[["layout", "block_size", "compact_every"]].drop_duplicates().itertuples(index=False, name=None)
    return sorted(keys, key=lambda k: (LAYOUTS.index(k[0]), k[1], k[2]))


def _label(key) -> str:
    name, block, every = key
    if name == "slots":
        return "slots freed %"
    return f"{name} B={block}{f' compact/{every}' if every else ''} freed %"


def plot(table: pd.DataFrame, path: Path) -> Path:
    """Grouped bars per model: x = policy @ ratio, one bar per layout, 95% intervals."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted(table["model"].unique())
    keys = _layout_keys(table)
    fig, axes = plt.subplots(len(models), 1, figsize=(10, 3.6 * len(models)), squeeze=False)
    width = 0.8 / len(keys)
    for ax, model in zip(axes[:, 0], models):
        part = table[table["model"] == model]
        groups = sorted({(p, r) for p, r in zip(part["policy"], part["cache_ratio"])})
        x = np.arange(len(groups))
        for j, key in enumerate(keys):
            sel = part[(part["layout"] == key[0]) & (part["block_size"] == key[1]) & (part["compact_every"] == key[2])]
            sel = sel.set_index(["policy", "cache_ratio"]).reindex(groups)
            mean = 100 * sel["freed_share"].to_numpy()
            err = 100 * np.vstack([sel["freed_share"] - sel["freed_lo"], sel["freed_hi"] - sel["freed_share"]])
            ax.bar(x + (j - (len(keys) - 1) / 2) * width, mean, width, yerr=err, capsize=2, label=_label(key))
        ax.set_xticks(x, [f"{p}\n@{r:g}" for p, r in groups])
        ax.set_ylabel("KV freed vs full cache (%)")
        ax.set_ylim(0, 100)
        n = part["samples"].max()
        ax.set_title(f"{model}: KV memory eviction frees, by layout (mean of {n} samples, 95% CI)")
        ax.grid(axis="y", alpha=0.3)
    axes[-1, 0].legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=len(keys))
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)
    return path


def traces_with_kept(folders) -> dict:
    """{model name: trace} for the given trace folders (or every bundled one) that hold kept positions."""
    import traces
    if not folders:
        folders = [f for f in traces.catalog().traces]
    out = {}
    for folder in folders:
        trace = traces.load(folder)
        if trace.manifest.get("detail", "full") != "full":
            continue
        name = f"{trace.model.get('name', Path(folder).parent.name)} / {Path(folder).name}"
        out[name] = trace
    if not out:
        raise ValueError("no trace with kept positions (capture with --detail full; "
                         "bash traces/data/regenerate.sh layouts)")
    return out


def build_parser():
    import argparse
    from kvcommon.cli import DefaultsHelpFormatter, OneLineParser, csv_list
    p = OneLineParser(prog="python -m sim.layouts_report", formatter_class=DefaultsHelpFormatter,
                      description="The share of KV memory per-head eviction frees in each layout (slots, paged, "
                                  "paged-head), from traces' kept positions: a markdown table, a CSV and a figure.")
    p.add_argument("traces", nargs="*", type=Path,
                   help="trace folders (default: every bundled trace with kept positions)")
    p.add_argument("--block-sizes", type=csv_list(int, "--block-sizes"), default=[16], help="tokens per block")
    p.add_argument("--compact-every", type=csv_list(int, "--compact-every"), default=[],
                   help="also the paged layout compacted every N decode steps (comma-separated N)")
    p.add_argument("--out", type=Path, required=True,
                   help=f"output folder (kv_freed_by_layout.md, kv_freed_by_layout.csv, {FIGURE_NAME})")
    return p


def main(argv=None) -> int:
    from kvcommon.cli import atomic_write_text, check_out_folder, staged_folder
    a = build_parser().parse_args(argv)
    check_out_folder("--out", a.out)     # before the traces are read (half a minute on the bundled ones)
    if any(b < 1 for b in a.block_sizes) or any(n < 1 for n in a.compact_every):
        raise ValueError("--block-sizes and --compact-every must be >= 1")
    layouts = [Layout("slots")]
    for b in a.block_sizes:
        layouts += [Layout("paged-head", block_size=b), Layout("paged", block_size=b)]
        layouts += [Layout("paged", block_size=b, compact_every=n) for n in a.compact_every]
    table = freed_table(traces_with_kept(a.traces), layouts)
    with staged_folder(a.out) as stage:      # the three files appear together, or not at all
        atomic_write_text(stage / "kv_freed_by_layout.md", markdown(table) + "\n")
        atomic_write_text(stage / "kv_freed_by_layout.csv", table.to_csv(index=False))
        plot(table, stage / FIGURE_NAME)
    print(a.out / FIGURE_NAME)
    return 0


if __name__ == "__main__":
    import sys
    from kvcommon.cli import run
    sys.exit(run(main))
