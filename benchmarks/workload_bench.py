"""How fast the DES replays a real trace: the one-hour Azure conversation trace (19,366 requests) on one
device in <= 30 s, and the SLO capacity search over it in <= 5 min.

    python benchmarks/workload_bench.py                      # both targets, Llama-3.1-8B on H100
    python benchmarks/workload_bench.py --window 0:600       # a quick look at the first ten minutes
    python benchmarks/workload_bench.py --no-search --exact  # also the replay with every step exact

Prints one line per case (host seconds of the simpy run, steps, microseconds per step, simulated P99 TTFT
and TPOT) and, last, one JSON object; the load average before and after (the machine may be shared) and
OMP_WAIT_POLICY are part of it. The trace is read from ../shared/data (or $KVSIM_DATA); without it the
script says so and exits 2. Decode steps run on sim.des.step_grid's grid (64 points per octave of the
mean KV length) unless --exact.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(REPO))

from kvcommon.cli import OneLineParser, run  # noqa: E402
from sim.des.serving import ServeConfig, run_config  # noqa: E402
from sim.des.slo import SLO, find_max_qps  # noqa: E402

REPLAY_TARGET_S = 30.0
SEARCH_TARGET_S = 300.0


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _parser() -> OneLineParser:
    p = OneLineParser(prog="python benchmarks/workload_bench.py", description=__doc__.splitlines()[0])
    p.add_argument("--trace", default="azure-conv-2023", help="bundled trace name or CSV")
    p.add_argument("--window", default=None, help="replay only START:END seconds of it")
    p.add_argument("--hw", default="h100-sxm")
    p.add_argument("--model", default="llama-3.1-8b")
    p.add_argument("--profile", default="trtllm")
    p.add_argument("--policy", default="full")
    p.add_argument("--cache-ratio", type=float, default=1.0)
    p.add_argument("--slo-ttft-p99", type=float, default=1.0)
    p.add_argument("--slo-tpot-p99", type=float, default=0.05)
    p.add_argument("--exact", action="store_true", help="also replay with every decode step exact")
    p.add_argument("--no-search", action="store_true", help="skip the SLO search")
    return p


def _case(label: str, cfg: ServeConfig) -> dict:
    t0 = time.perf_counter()
    res = run_config(cfg)
    total = time.perf_counter() - t0
    row = {"case": label, "requests": res.config["requests"], "steps": res.steps, "sim_s": round(res.wall_s, 2),
           "total_s": round(total, 2), "us_per_step": round(1e6 * res.wall_s / max(res.steps, 1), 1),
           "ttft_p99_s": res.ttft_s["p99"], "tpot_p99_s": res.tpot_s["p99"], "completed": res.completed}
    print(f"{label:40s} {row['requests']:6d} req {row['steps']:8d} steps {row['sim_s']:7.2f} s "
          f"({row['us_per_step']:.0f} us/step)  P99 TTFT {row['ttft_p99_s']:.4g} s  TPOT {row['tpot_p99_s']:.4g} s",
          file=sys.stderr)
    return row


def _main(argv=None) -> int:
    a = _parser().parse_args(argv)
    before = load_average()
    base = ServeConfig(hw=a.hw, model=a.model, policy=a.policy, cache_ratio=a.cache_ratio, profile=a.profile,
                       request_trace=a.trace, window=a.window, qps=None, requests=None, step_grid=64)
    rows = [_case(f"replay {a.trace} as recorded (grid)", base)]
    if a.exact:
        from dataclasses import replace
        rows.append(_case(f"replay {a.trace} as recorded (exact)", replace(base, step_grid=None)))
    search = None
    if not a.no_search:
        slo = SLO(slo_ttft_p99=a.slo_ttft_p99, slo_tpot_p99=a.slo_tpot_p99)
        t0 = time.perf_counter()
        found = find_max_qps(base, slo)
        search = {"slo": slo.describe(), "max_qps": found.max_qps, "runs": found.runs, "reason": found.reason,
                  "seconds": round(time.perf_counter() - t0, 1)}
        print(f"SLO search ({slo.describe()}): max qps {found.max_qps:.4g} in {found.runs} replays, "
              f"{search['seconds']:.1f} s", file=sys.stderr)
    result = {"hw": a.hw, "model": a.model, "profile": a.profile, "policy": a.policy, "trace": a.trace,
              "window": a.window, "cases": rows, "search": search,
              "replay_target_s": REPLAY_TARGET_S, "search_target_s": SEARCH_TARGET_S,
              "replay_within_target": rows[0]["total_s"] <= REPLAY_TARGET_S,
              "search_within_target": None if search is None else search["seconds"] <= SEARCH_TARGET_S,
              "load_average_before": before, "load_average_after": load_average(),
              "cpu_count": os.cpu_count(), "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "unset")}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(run(_main))
