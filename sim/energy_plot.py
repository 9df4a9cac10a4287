"""Energy per token and cost per million output tokens against the cache ratio, per device, each point at
the largest batch that fits (issue 18's figure).

    python -m sim.energy_plot --hw h100-sxm,h200-sxm,mi300x,l40s --model llama-3-8b --policy h2o \\
        --prompt 4096 --gen 512 --out results/energy

For every device and cache ratio: the steady-state largest batch (`max_batch`, continuous batching) of
`sim.parallel.predict` at `--tp`/`--pp`, then the prediction at that batch, its energy
(`sim.energy.energy_summary`) and cost (`sim.cost`). Writes `energy_cost.csv` and `energy_cost.png`.
Devices without energy or price data are kept in the table with empty columns and a note.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

import pandas as pd

from kvcommon.cli import OneLineParser, positive_int, run
from sim import cost, energy, parallel

COLUMNS = ("hw", "model", "policy", "cache_ratio", "tp", "pp", "devices", "batch", "tokens_per_s", "tpot_s",
           "energy_j_per_token", "energy_j_per_output_token", "kv_j_per_token", "weights_j_per_token",
           "static_j_per_token", "cost_per_mtok", "price_usd_per_hour", "note")


def point(hw, model, policy, cache_ratio, *, prompt, gen, tp=1, pp=1, price=None, **kw) -> dict:
    """One row: the largest batch that fits at this cache ratio and its energy and cost."""
    probe = parallel.predict(hw, model, 1, prompt, gen, policy, cache_ratio, tp=tp, pp=pp, **kw)
    row = dict(hw=probe.inputs["hw"], model=probe.inputs["model"], policy=policy, cache_ratio=cache_ratio, tp=tp, pp=pp,
               devices=tp * pp, batch=probe.max_batch)
    if probe.max_batch < 1:
        return {**dict.fromkeys(COLUMNS), **row, "note": "does not fit"}
    p = parallel.predict(hw, model, probe.max_batch, prompt, gen, policy, cache_ratio, tp=tp, pp=pp, **kw)
    e, c = energy.energy_summary(p), cost.cost_summary(p, override=price)
    parts = e["decode_energy_breakdown_j_per_token"] or {}
    notes = [n for n in (None if e["energy_j_per_token"] is not None else e["energy_note"],
                         None if c["cost_per_mtok"] is not None else c["price_source"]) if n]
    return {**row, "tokens_per_s": p.tokens_per_s, "tpot_s": p.tpot_s, "energy_j_per_token": e["energy_j_per_token"],
            "energy_j_per_output_token": e["energy_j_per_output_token"], "kv_j_per_token": parts.get("kv"),
            "weights_j_per_token": parts.get("weights"), "static_j_per_token": parts.get("static"),
            "cost_per_mtok": c["cost_per_mtok"], "price_usd_per_hour": c["price_usd_per_hour"], "note": "; ".join(notes)}


def table(hws, model, policy, cache_ratios, **kw) -> pd.DataFrame:
    rows = [point(hw, model, policy, r, **kw) for hw in hws for r in cache_ratios]
    return pd.DataFrame(rows, columns=list(COLUMNS))


def plot(frame: pd.DataFrame, path: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for hw, g in frame.groupby("hw", sort=False):
        g = g.dropna(subset=["energy_j_per_token"]).sort_values("cache_ratio")
        if g.empty:
            continue
        label = hw if int(g["devices"].iloc[0]) == 1 else f"{hw} x{int(g['devices'].iloc[0])}"
        left.plot(g["cache_ratio"], g["energy_j_per_token"] * 1e3, marker="o", label=label)
        c = g.dropna(subset=["cost_per_mtok"])
        right.plot(c["cache_ratio"], c["cost_per_mtok"], marker="o", label=label)
    first = frame.iloc[0]
    for ax, title in ((left, "decode energy per output token (mJ)"), (right, "cost per million output tokens (USD)")):
        ax.set_xlabel("cache ratio (KV budget / prompt)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
    left.legend()
    fig.suptitle(f"{first['model']}, {first['policy']}, at the largest batch that fits (steady state)")
    fig.tight_layout()
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    os.replace(tmp, path)
    return path


def _floats(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not values or any(not 0 < v <= 1 for v in values):
        raise argparse.ArgumentTypeError(f"cache ratios must be in (0, 1], got {text!r}")
    return values


def main(argv=None) -> int:
    p = OneLineParser(prog="python -m sim.energy_plot", description=__doc__.split("\n")[0])
    p.add_argument("--hw", default="h100-sxm,h200-sxm,a100-80g-sxm,mi300x,l40s", help="comma-separated devices")
    p.add_argument("--model", default="llama-3-8b")
    p.add_argument("--policy", default="h2o")
    p.add_argument("--cache-ratios", type=_floats, default=[0.1, 0.2, 0.3, 0.5, 0.75, 1.0])
    p.add_argument("--prompt", type=positive_int, default=4096)
    p.add_argument("--gen", type=positive_int, default=512)
    p.add_argument("--tp", type=positive_int, default=1)
    p.add_argument("--pp", type=positive_int, default=1)
    p.add_argument("--weight-dtype", default="bf16")
    p.add_argument("--kv-dtype", default="bf16")
    p.add_argument("--profile", default="fused")
    p.add_argument("--price-per-hour", type=float, help="USD per device-hour for every device (default: each "
                   "device's documented price)")
    p.add_argument("--out", default="results/energy", help="output folder")
    a = p.parse_args(argv)
    try:
        frame = table([h for h in a.hw.split(",") if h], a.model, a.policy, a.cache_ratios, prompt=a.prompt, gen=a.gen,
                      tp=a.tp, pp=a.pp, price=a.price_per_hour, weight_dtype=a.weight_dtype, kv_dtype=a.kv_dtype,
                      profile=a.profile)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "energy_cost.csv.tmp"
    frame.to_csv(tmp, index=False)
    os.replace(tmp, out / "energy_cost.csv")
    plot(frame, out / "energy_cost.png")
    shown = frame[["hw", "cache_ratio", "batch", "energy_j_per_token", "cost_per_mtok"]]
    print(shown.to_string(index=False, float_format=lambda v: f"{v:.4g}" if math.isfinite(v) else "-"))
    print(f"wrote {out / 'energy_cost.csv'} and {out / 'energy_cost.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
