"""The serving DES at a million requests: 1,000,000 requests of 512 + 512 tokens within 4 minutes and 1 GB
peak resident memory (issue 29), one process.

    python benchmarks/serve_million.py                       # the target run, every step time exact
    python benchmarks/serve_million.py --step-grid 64        # decode steps on the grid (sim.des.step_grid)
    python benchmarks/serve_million.py --requests 100000     # a tenth of it
    python benchmarks/serve_million.py --per-request results/million.csv   # with the per-request CSV

Prints the host seconds of the whole call (workload, simulation, metrics), the simulated steps, the peak
resident set size of the process (ru_maxrss: a high-water mark, so the run is measured in a fresh process
after one tiny warm-up run that loads the modules) and the bytes per request above the warm-up's, then the
run's headline metrics. Llama-3-8B on an H100, full attention, every request at t = 0 (the saturated
server: the largest batches, the fewest steps per request) unless --qps says otherwise.

Measured on the 2-core development VM (2026-12-02, background jobs paused; docs/performance.md has the
table): every step exact, 1,000,000 requests: 194 s, 588 MiB peak RSS, 501 bytes/request (1.2 M steps,
158 us/step; the float step time of sim.engine.scalar, 1.64x the numpy path's in one run); --step-grid 64:
139 s. Before issue 29: 100,000 requests exact, 53 s, 1,794 MiB, 17,231 bytes/request (another host).
"""
from __future__ import annotations

import json
import math
import resource
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(REPO))

from kvcommon.cli import OneLineParser  # noqa: E402
from sim.des.serving import ServeConfig, run_config  # noqa: E402

TARGET_S = 240.0
TARGET_RSS = 2**30
TARGET_BYTES_PER_REQUEST = 2048


def _rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024   # Linux reports KiB


def main(argv=None) -> int:
    p = OneLineParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=1_000_000)
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--gen", type=int, default=512)
    p.add_argument("--qps", type=float, default=float("inf"))
    p.add_argument("--hw", default="h100-sxm")
    p.add_argument("--model", default="llama-3-8b")
    p.add_argument("--step-grid", type=int, default=None, metavar="N",
                   help="decode steps timed on sim.des.step_grid's grid (relative error < 1e-4 at 64; the SLO "
                        "search's setting); default: every step exact")
    p.add_argument("--per-request", default=None, metavar="CSV", help="also write the per-request CSV")
    p.add_argument("--json", action="store_true", help="one JSON object")
    args = p.parse_args(argv)
    if args.requests < 1 or args.gen < 1 or args.prompt < 1 or not args.qps > 0 or (args.step_grid or 1) < 1:
        print("error: --requests, --prompt, --gen and --step-grid must be >= 1 and --qps > 0", file=sys.stderr)
        return 2
    if args.per_request and not Path(args.per_request).resolve().parent.is_dir():
        print(f"error: --per-request {args.per_request}: its folder does not exist", file=sys.stderr)
        return 2
    base = dict(hw=args.hw, model=args.model, policy="full", prompt=args.prompt, gen=args.gen, qps=args.qps,
                step_grid=args.step_grid)
    run_config(ServeConfig(requests=10, **base))       # imports and the engine's caches, not measured
    rss0 = _rss()
    start = time.perf_counter()
    extra = {"per_request": args.per_request} if args.per_request else {}
    res = run_config(ServeConfig(requests=args.requests, **base), **extra)
    wall = time.perf_counter() - start
    rss = _rss()
    qps = args.qps if math.isfinite(args.qps) else "inf"       # strict JSON
    row = dict(requests=args.requests, prompt=args.prompt, gen=args.gen, qps=qps, hw=args.hw, model=args.model,
               step_grid=args.step_grid,
               wall_s=wall, sim_wall_s=res.wall_s, steps=res.steps, peak_rss_bytes=rss, warmup_rss_bytes=rss0,
               bytes_per_request=(rss - rss0) / args.requests, completed=res.completed,
               tokens_per_s=res.tokens_per_s, ttft_p99_s=res.ttft_s["p99"], itl_p99_s=res.itl_s["p99"])
    if args.json:
        print(json.dumps(row))
        return 0
    timing = f"decode steps on a {args.step_grid}-point grid" if args.step_grid else "every step exact"
    print(f"{args.requests:,} requests x {args.prompt} + {args.gen} tokens, {args.model} on {args.hw}, "
          f"qps {args.qps:g}, {timing}")
    print(f"wall {wall:.1f} s (simulation {res.wall_s:.1f} s, {res.steps:,} steps, "
          f"{res.wall_s / res.steps * 1e6:.0f} us/step); target {TARGET_S:.0f} s: "
          + ("within" if wall <= TARGET_S else "OVER"))
    within = rss <= TARGET_RSS and rss - rss0 <= TARGET_BYTES_PER_REQUEST * args.requests
    print(f"peak RSS {rss / 2**20:.0f} MiB ({(rss - rss0) / args.requests:.0f} bytes/request above the warm-up's "
          f"{rss0 / 2**20:.0f} MiB); targets {TARGET_RSS / 2**20:.0f} MiB and {TARGET_BYTES_PER_REQUEST} "
          "bytes/request: " + ("within" if within else "OVER"))
    print(f"simulated: {res.completed:,} completed, {res.tokens_per_s:,.0f} output tok/s, "
          f"P99 TTFT {res.ttft_s['p99']:.1f} s, P99 ITL {res.itl_s['p99'] * 1e3:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
