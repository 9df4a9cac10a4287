"""Goodput under a latency SLO on the Azure conversation trace: per deployment, policy and cache ratio, the
highest rate the trace can be time-scaled to (sim.des.slo's search over a replay) with P99 TTFT and P99
TPOT within the limits, and the KV memory over time of full attention against an evicting policy.

    python benchmarks/workload_goodput.py                          # results/figures/workloads_goodput.{csv,png}
    python benchmarks/workload_goodput.py --update-docs            # the tracked docs/figures/ copy
    python benchmarks/workload_goodput.py --window 0:300 --out /tmp/g   # a quick look

The table docs/workloads.md shows is this script's CSV (it prints it as markdown too); the figure has the
rates (left) and the KV memory over time at one common rate (right). Engine profile: trtllm (its fitted
terms from sim/engine_profiles/, whatever is committed when it runs). The trace is read from
../shared/data (or $KVSIM_DATA). Decode steps run on sim.des.step_grid (64 points per octave).
"""
from __future__ import annotations

import json
import os
import re
import sys
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(REPO))

import pandas as pd  # noqa: E402

from kvcommon.cli import OneLineParser, atomic_write_text, run  # noqa: E402
from sim.des.serving import ServeConfig, run_config  # noqa: E402
from sim.des.slo import SLO, find_max_qps  # noqa: E402

DEPLOYMENTS = [("Llama-3.1-8B, H100", "h100-sxm", "llama-3.1-8b", 1),
               ("Llama-3.1-8B, H200", "h200-sxm", "llama-3.1-8b", 1),
               ("Llama-3.1-70B, 4x H100 (TP4)", "h100-sxm", "llama-3.1-70b", 4)]
POLICIES = [("full", 1.0), ("h2o", 0.5), ("h2o", 0.2), ("keyformer", 0.5), ("keyformer", 0.2)]
KV_PAIR = (("full", 1.0), ("h2o", 0.2))      # the KV-over-time panel: full against an evicting policy


def _parser() -> OneLineParser:
    p = OneLineParser(prog="python benchmarks/workload_goodput.py", description=__doc__.splitlines()[0])
    p.add_argument("--trace", default="azure-conv-2023")
    p.add_argument("--window", default="0:300", help="the part of the trace replayed (seconds); 'all' for the hour")
    p.add_argument("--profile", default="trtllm")
    p.add_argument("--slo-ttft-p99", type=float, default=1.0)
    p.add_argument("--slo-tpot-p99", type=float, default=0.05)
    p.add_argument("--max-requests", type=int, default=800,
                   help="the steady-state search's longest measured length (sim.des.slo; it starts at 200)")
    p.add_argument("--deployments", default=None, metavar="I,J",
                   help="only these rows of DEPLOYMENTS (0-based), written to workloads_goodput.part-I-J.csv")
    p.add_argument("--merge", nargs="+", type=Path, default=None, metavar="CSV",
                   help="no searches: join these part files, then the KV panel, the figure and the table")
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default results/figures; docs/figures only with --update-docs)")
    p.add_argument("--update-docs", action="store_true", help="write the tracked docs/figures/ copy")
    return p


def _config(a, label: str, policy: str, ratio: float) -> ServeConfig:
    _, hw, model, tp = next(d for d in DEPLOYMENTS if d[0] == label)
    return ServeConfig(hw=hw, model=model, policy=policy, cache_ratio=ratio, profile=a.profile, tp=tp,
                       request_trace=a.trace, window=None if a.window == "all" else a.window, qps=None,
                       requests=None, step_grid=64)


def goodput_rows(a, slo: SLO, deployments) -> list[dict]:
    rows = []
    for label, hw, model, tp in deployments:
        for policy, ratio in POLICIES:
            cfg = _config(a, label, policy, ratio)
            t0 = time.perf_counter()
            found = find_max_qps(cfg, slo, max_requests=a.max_requests)
            at = found.at_max
            row = {"deployment": label, "hw": hw, "model": model, "tp": tp, "policy": policy, "cache_ratio": ratio,
                   "max_qps": found.max_qps, "time_scale": at.config["replay"]["time_scale"] if at else None,
                   "tokens_per_s": at.tokens_per_s if at else 0.0,
                   "ttft_p99_s": at.ttft_s["p99"] if at else None, "tpot_p99_s": at.tpot_s["p99"] if at else None,
                   "kv_peak_gb": at.peak_kv_bytes / 1e9 if at else None,
                   "kv_capacity_gb": at.kv_capacity_bytes / 1e9 if at else None,
                   "preemptions": at.preemptions if at else None, "bound": found.reason, "runs": found.runs,
                   "measured_requests": found.requests, "stable": found.stable,
                   "search_s": round(time.perf_counter() - t0, 1)}
            rows.append(row)
            print(f"{label:30s} {policy:9s} {ratio:4.2f}: max qps {found.max_qps:.3g} ({found.runs} runs, "
                  f"{row['search_s']} s) {found.reason}", file=sys.stderr)
    return rows


def kv_timelines(a, rows) -> pd.DataFrame:
    """KV bytes over time on the first deployment, full and the evicting policy, at full's highest rate."""
    label = DEPLOYMENTS[0][0]
    full = next(r for r in rows if r["deployment"] == label and r["policy"] == "full")
    qps = full["max_qps"] if 0 < full["max_qps"] < float("inf") else None
    frames = []
    for policy, ratio in KV_PAIR:
        res = run_config(replace(_config(a, label, policy, ratio), qps=qps))
        t = res.timeline
        frames.append(pd.DataFrame({"policy": policy if policy == "full" else f"{policy} {ratio:g}", "t_s": t["t_s"], "kv_gb": t["kv_bytes"] / 1e9,
                                    "capacity_gb": res.kv_capacity_bytes / 1e9, "qps": qps}))
    return pd.concat(frames, ignore_index=True)


def plot(table: pd.DataFrame, kv: pd.DataFrame, path: Path, slo: SLO, trace: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from kvcommon.styles import style as policy_style
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.6))
    deployments = list(dict.fromkeys(table["deployment"]))
    width = 0.8 / len(POLICIES)
    for j, (policy, ratio) in enumerate(POLICIES):
        sub = table[(table["policy"] == policy) & (table["cache_ratio"] == ratio)].set_index("deployment")
        values = [float(sub.loc[d, "max_qps"]) for d in deployments]
        left.bar([i + (j - (len(POLICIES) - 1) / 2) * width for i in range(len(deployments))], values, width,
                 color=policy_style(policy).color, alpha=1.0 if ratio >= 0.5 else 0.55, edgecolor="black", linewidth=0.4,
                 label=f"{policy}" + ("" if policy == "full" else f" {ratio:g}"))
    left.set_xticks(range(len(deployments)), deployments, fontsize=8)
    left.set_ylabel("highest request rate meeting the SLO (req/s)")
    left.set_title(f"{trace}: {slo.describe()}", fontsize=9)
    left.set_ylim(0, 1.25 * float(table["max_qps"].replace(float("inf"), 0).max() or 1))
    left.legend(fontsize=7, ncol=5, loc="upper center")
    for name, sub in kv.groupby("policy", sort=False):
        right.step(sub["t_s"] / 60, sub["kv_gb"], where="post", label=name, linewidth=0.8,
                   color=policy_style(name.split()[0]).color)
    right.axhline(kv["capacity_gb"].iloc[0], color="grey", linestyle="--", linewidth=0.8, label="KV capacity")
    qps = kv["qps"].iloc[0]
    right.set_title(f"{deployments[0]}: KV memory over time at {qps:.3g} req/s" if qps else
                    f"{deployments[0]}: KV memory over time, as recorded", fontsize=9)
    right.set_xlabel("simulated time (min)")
    right.set_ylabel("KV cache in use (GB)")
    right.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp, dpi=130)
    plt.close(fig)
    os.replace(tmp, path)


def _bound(reason: str) -> str:
    """'at 14 req/s: stopped early: ... TPOT limit ...; not shown stable ...' -> 'P99 TPOT at 14 req/s'."""
    head = str(reason).split(";")[0]
    rate = re.match(r"at (\S+) req/s", head)
    metric = next((m for m in ("TTFT", "TPOT", "dropped") if m in head), None)
    if rate and metric:
        return f"P99 {metric} at {rate.group(1)} req/s" if metric != "dropped" else f"drops at {rate.group(1)} req/s"
    return head


def markdown(table: pd.DataFrame) -> str:
    lines = ["| deployment | policy | cache ratio | max qps | vs full | output tok/s | P99 TTFT (s) | P99 TPOT (ms) | "
             "KV peak / capacity (GB) | first miss |", "|---|---|---|---|---|---|---|---|---|---|"]
    for row in table.itertuples():
        full = table[(table.deployment == row.deployment) & (table.policy == "full")]["max_qps"].iloc[0]
        ratio = row.max_qps / full if full and 0 < full < float("inf") else float("nan")
        kv = f"{row.kv_peak_gb:.1f} / {row.kv_capacity_gb:.1f}" if pd.notna(row.kv_peak_gb) else "n/a"
        tpot = f"{1e3 * row.tpot_p99_s:.1f}" if pd.notna(row.tpot_p99_s) else "n/a"
        ttft = f"{row.ttft_p99_s:.3f}" if pd.notna(row.ttft_p99_s) else "n/a"
        lines.append(f"| {row.deployment} | {row.policy} | {row.cache_ratio:g} | {row.max_qps:.3g} | {ratio:.2f} | "
                     f"{row.tokens_per_s:,.0f} | {ttft} | {tpot} | {kv} | {_bound(row.bound)} |")
    return "\n".join(lines)


def _main(argv=None) -> int:
    a = _parser().parse_args(argv)
    if a.out is None:
        a.out = REPO / "docs" / "figures" if a.update_docs else Path("results") / "figures"
    slo = SLO(slo_ttft_p99=a.slo_ttft_p99, slo_tpot_p99=a.slo_tpot_p99)
    before = os.getloadavg()
    t0 = time.perf_counter()
    stem = a.out / "workloads_goodput"
    a.out.mkdir(parents=True, exist_ok=True)
    if a.deployments is not None:
        picked = [DEPLOYMENTS[int(i)] for i in a.deployments.split(",")]
        part = pd.DataFrame(goodput_rows(a, slo, picked))
        atomic_write_text(a.out / f"workloads_goodput.part-{a.deployments.replace(',', '-')}.csv",
                          part.to_csv(index=False))
        return 0
    if a.merge:
        table = pd.concat([pd.read_csv(p) for p in a.merge], ignore_index=True)
        order = {d[0]: i for i, d in enumerate(DEPLOYMENTS)}
        table = table.sort_values("deployment", key=lambda c: c.map(order), kind="stable").reset_index(drop=True)
        rows = table.to_dict("records")
    else:
        rows = goodput_rows(a, slo, DEPLOYMENTS)
        table = pd.DataFrame(rows)
    kv = kv_timelines(a, rows)
    atomic_write_text(stem.with_suffix(".csv"), table.to_csv(index=False))
    plot(table, kv, stem.with_suffix(".png"), slo, a.trace)
    md = markdown(table)
    print(md)
    print(json.dumps({"seconds": round(time.perf_counter() - t0, 1), "load_average_before": before,
                      "load_average_after": os.getloadavg(), "window": a.window, "profile": a.profile}),
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(run(_main))
