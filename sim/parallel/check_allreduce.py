"""The collective model of sim.parallel against published all-reduce latencies (sim/references/
allreduce_h100_published.yaml): one all-reduce = collectives.allreduce_time over the device's interconnect
data (hwmodels/platform/<device>.yaml) plus one kernel launch (the device file's launch_overhead_s), the
time a back-to-back host-timed benchmark sees. Nothing here is fitted.

    python -m sim.parallel.check_allreduce [--json]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import yaml

from hwmodels.platform import load_interconnect
from sim import engine
from sim.cli import OneLineParser, run

from .collectives import allreduce_time

REFERENCE = Path(__file__).resolve().parents[1] / "references" / "allreduce_h100_published.yaml"


def compare(path: Path | str = REFERENCE) -> list[dict]:
    """One record per published point: kernel, tp, message bytes, measured and predicted microseconds."""
    data = yaml.safe_load(Path(path).read_text())
    device = engine.resolve_device(data["device"])
    link = load_interconnect(device)
    out = []
    for kernel, entry in data["kernels"].items():
        for tp, row in entry["latency_us"].items():
            for elements, measured in zip(data["sizes_elements"], row):
                message = elements * data["dtype_bytes"]
                predicted = (float(allreduce_time(link, message, int(tp))) + device.launch_overhead_s) * 1e6
                out.append(dict(kernel=kernel, tp=int(tp), message_bytes=message, measured_us=measured,
                                predicted_us=predicted, error_pct=100.0 * (predicted / measured - 1.0)))
    return out


def mape(records: list[dict], kernel: str, min_bytes: float = 0.0) -> float:
    errors = [abs(r["error_pct"]) for r in records if r["kernel"] == kernel and r["message_bytes"] >= min_bytes]
    return float(np.mean(errors))


def _main(argv=None) -> int:
    p = OneLineParser(prog="python -m sim.parallel.check_allreduce", description=__doc__.split("\n")[0])
    p.add_argument("--json", action="store_true", help="print JSON records")
    args = p.parse_args(argv)
    records = compare()
    if args.json:
        print(json.dumps(records, indent=1))
        return 0
    for r in records:
        print(f"{r['kernel']:7s} tp={r['tp']} {r['message_bytes'] / 1024:8.0f} KiB  measured {r['measured_us']:5.1f} us  "
              f"predicted {r['predicted_us']:5.1f} us ({r['error_pct']:+.0f}%)")
    for kernel in sorted({r["kernel"] for r in records}):
        print(f"{kernel}: MAPE {mape(records, kernel):.1f}% (messages >= 1 MiB: {mape(records, kernel, 2**20):.1f}%)")
    return 0


def main(argv=None) -> int:
    """A bad flag is one `error: ...` line and exit code 2 (the kit's run)."""
    return run(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
