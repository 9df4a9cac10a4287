"""Discrete-event simulation of one accelerator serving a request stream (vLLM-like continuous batching).

    python -m sim.serve --hw a100-80g-sxm --model mpt-7b --policy keyformer --cache-ratio 0.5 \\
        --qps 2 --requests 200 --prompt 4096 --gen 4096 --kv-dtype fp16 --weight-dtype fp16 [--json]

Every step is timed by sim.engine (the analytic operator model); memory, scheduling and metrics are in
sim.des. Metrics follow vLLM's benchmark_serving (docs/metrics.md). Python entry: `simulate(...)`.
"""
from __future__ import annotations

import sys

# The logic lives in the package sim/des/ (serving: one run; cli: the flags and the report); these are
# this command's public names.
from sim.des.cli import _parser, format_report, main, run_estimate  # noqa: F401
from sim.des.serving import CONFIG_FIELDS, ServeConfig, run_config, simulate, simulate_row  # noqa: F401

if __name__ == "__main__":
    sys.exit(main())
