"""`python -m sim.sweep`: evaluate a grid of design points and write a table, plots and a summary.

    python -m sim.sweep                                  # embedded defaults (datasheet devices x 4 models x ...)
    python -m sim.sweep --hw h100-sxm,l4 --models llama-3-8b --cache-ratios 0.2,0.5,1 --out results/mine
    python -m sim.sweep --config grid.yaml               # same keys as GridConfig; flags override the file
    python -m sim.sweep --workers 2                      # local worker processes
    python -m sim.sweep --scheduler tcp://host:8786      # a Dask distributed cluster
    python -m sim.sweep --engine des --qps 4             # the discrete-event serving simulator per point
    python -m sim.sweep --engine des --qps 1,4,inf --slo-ttft-p99 2 --slo-tpot-p99 0.05   # a qps axis, max_qps_slo

Three pure steps, so sim.runner can chunk, spread and cache the middle one:
    build_grid(config) -> DataFrame of inputs (one row per point)
    evaluate(points)   -> DataFrame of outputs, one row per input row, same order
    write_outputs(table, out_dir)

Every point's result is cached (`--cache-dir`, default .cache/sweep) under a hash of its whole
configuration (device file content, model spec, policy, trace content, code version): a rerun reuses
it, and an interrupted sweep resumes where it stopped. Besides the formula-driven grid, the sweep
predicts every policy x cache ratio of the bundled traces (`traces/data/`, real models) from their
measured KV lengths and joins each with its measured quality (`tradeoff.parquet`, `pareto_*.png`).

Modules (one seam each): grid (GridConfig, build_grid), options (RunOptions, load_config), analytic
(evaluate), summary (write_outputs, the Markdown summary), des (evaluate_des, write_des_outputs), phases
(cache keys, running a phase through sim.runner), cli (the flags and main); this package re-exports them.
"""
from sim.sweep.analytic import OUTPUT_COLUMNS, evaluate
from sim.sweep.cli import build_parser, config_from_args, main
from sim.sweep.des import DES_SUMMARY_COLUMNS, evaluate_des, write_des_outputs
from sim.sweep.grid import (DEFAULT_MODELS, DEFAULT_RATIOS, GROUP_COLUMNS, INPUT_COLUMNS, GridConfig,
                            build_grid, datasheet_devices)
from sim.sweep.options import ENGINES, OWN, RunOptions, load_config
from sim.sweep.phases import Phase, cache_key_columns, execution_line, run_phase, trace_phase
from sim.sweep.summary import (FITS_ONLY_WITH_EVICTION, HEADLINE_BUDGETS, context_lines, headline, summary_markdown,
                               write_outputs)

__all__ = ["DEFAULT_MODELS", "DEFAULT_RATIOS", "DES_SUMMARY_COLUMNS", "ENGINES", "FITS_ONLY_WITH_EVICTION",
           "GROUP_COLUMNS", "HEADLINE_BUDGETS", "INPUT_COLUMNS", "OUTPUT_COLUMNS", "OWN", "GridConfig", "Phase",
           "RunOptions", "build_grid", "build_parser", "cache_key_columns", "config_from_args", "context_lines",
           "datasheet_devices", "evaluate", "evaluate_des", "execution_line", "headline", "load_config", "main",
           "run_phase", "summary_markdown", "trace_phase", "write_des_outputs", "write_outputs"]
