"""What one group of the analytic engine costs: `engine.evaluate` on 1 to 10,000 points sharing (device,
model, policy, profile), the unit `sim.sweep` evaluates, so a group's fixed part (building and timing its
operator tables) and its part per point can be read apart.

    python benchmarks/engine_groups.py                          # full, h2o, keyformer on an H100, Llama-2-7B
    python benchmarks/engine_groups.py --policies full --sizes 1,1000 --repeats 50

Prints per policy and size the median milliseconds per call and microseconds per point. The points are
sim.bench's random draw (batch, beams, prompt, gen, ratios, mixed dtypes), profile fused.
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(REPO))

from kvcommon.cli import OneLineParser, run  # noqa: E402


def main(argv=None) -> int:
    p = OneLineParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hw", default="h100-sxm")
    p.add_argument("--model", default="llama-2-7b")
    p.add_argument("--policies", default="full,h2o,keyformer")
    p.add_argument("--sizes", default="1,100,1000,10000", help="points per group, comma-separated")
    p.add_argument("--repeats", type=int, default=20)
    a = p.parse_args(argv)
    try:
        sizes = [int(x) for x in a.sizes.split(",")]
    except ValueError:
        p.error(f"--sizes: expected comma-separated whole numbers, got {a.sizes!r}")
    if min(sizes) < 1 or a.repeats < 1:
        p.error("--sizes and --repeats must be >= 1")
    from hwmodels import load_device
    from sim import engine
    from sim.bench import random_points
    from sim.models import load_model
    hw, spec = load_device(a.hw), load_model(a.model)
    points = random_points(max(sizes), 0)
    print(f"{a.hw}, {a.model}, profile fused: median of {a.repeats} calls")
    for policy in a.policies.split(","):
        for n in sizes:
            g = points.iloc[:n]
            kw = {c: g[c].to_numpy() for c in ("batch", "prompt", "gen", "cache_ratio", "recent_ratio", "beams",
                                                "kv_dtype", "weight_dtype")}
            engine.evaluate(hw, spec, policy, profile="fused", **kw)           # warm: setup caches
            times = []
            for _ in range(a.repeats):
                t0 = time.perf_counter()
                engine.evaluate(hw, spec, policy, profile="fused", **kw)
                times.append(time.perf_counter() - t0)
            t = statistics.median(times)
            print(f"{policy:10s} {n:6d} points  {t * 1e3:8.2f} ms  {t / n * 1e6:8.2f} us/point")
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
