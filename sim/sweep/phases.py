"""Cache keys and the sweep's phases (the grid, the trace-driven points), each run through sim.runner."""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from sim import runner
from sim.sweep.analytic import evaluate
from sim.sweep.des import evaluate_des
from sim.sweep.grid import GridConfig, INPUT_COLUMNS
from sim.sweep.options import RunOptions

def cache_key_columns(points: pd.DataFrame) -> list[str]:
    """What identifies a point's result: every input but the device and model *names* (their content
    hashes stand in, so editing a device file recomputes exactly its points, and a renamed copy
    reuses them), the trace's content hash (not its path) and, for the DES, the load it serves."""
    names = {"hw", "model", "trace", "trace_path", "trace_model"}
    extra = ["hw_hash", "model_hash", "policy_label", "trace_hash", "layout", "block_size", "compact_every", "qps",
             "requests", "tp", "pp", "prompt_dist", "gen_dist", "slo_ttft_p99", "slo_tpot_p99", "workload", "window",
             "overlong"]
    return [c for c in INPUT_COLUMNS if c not in names] + [c for c in extra if c in points.columns]


def des_points(points: pd.DataFrame, options: RunOptions) -> pd.DataFrame:
    """The DES's points: each point at each rate of `qps` (a grid axis), with `requests`; the length
    distributions and the SLO limits join as columns (and so the cache key) only when they are set, so
    a fixed-length sweep without an SLO has the table it always had."""
    extra = {k: getattr(options, k) for k in ("prompt_dist", "gen_dist") if getattr(options, k) != "fixed"}
    extra.update({k: getattr(options, k) for k in ("slo_ttft_p99", "slo_tpot_p99") if options.slo is not None})
    if options.workload is not None:    # a replayed trace: its name, window and overlong handling are inputs
        extra.update(workload=options.workload, window=options.window, overlong=options.overlong)
    per_rate = [points.assign(qps=q, requests=options.requests_per_run, **extra) for q in options.qps_values]
    return per_rate[0] if len(per_rate) == 1 else pd.concat(per_rate, ignore_index=True)


@dataclass
class Phase:
    """One group of points run through sim.runner, and what came out."""
    name: str
    points: pd.DataFrame
    result: runner.RunResult | None = None

    @property
    def table(self) -> pd.DataFrame:
        return pd.concat([self.points.reset_index(drop=True), self.result.table], axis=1)


def run_phase(name: str, points: pd.DataFrame, evaluate_fn, options: RunOptions, executor) -> Phase:
    context = {"engine": options.engine}
    if options.engine == "des":
        points = des_points(points, options)
    phase = Phase(name, points)
    phase.result = runner.run_points(points, evaluate_fn, key_columns=cache_key_columns(points), context=context,
                                     cache_dir=options.cache_dir, executor=executor, desc=name,
                                     # the grid evaluate reads only the inputs: ship just those to workers
                                     eval_columns=INPUT_COLUMNS if evaluate_fn is evaluate else None,
                                     max_chunk=4 if options.engine == "des" else runner.DEFAULT_MAX_CHUNK)
    return phase


def trace_phase(config: GridConfig, options: RunOptions, executor):
    """Trace-driven points of every trace (None without traces), and the traces' measured quality."""
    from sim import traced, tradeoff
    dirs = options.trace_dirs()
    if not dirs:
        return None, None
    grid = traced.trace_grid(config, dirs, models=options.trace_models, prompts=options.trace_prompts,
                             gens=options.trace_gens, batches=options.trace_batches, layouts=options.layouts(),
                             cache_dir=options.cache_dir)
    quality = pd.concat([traced.trace_quality(d, tradeoff.trace_identity(d), options.cache_dir) for d in dirs],
                        ignore_index=True)
    evaluate_fn = evaluate_des if options.engine == "des" else traced.evaluate
    return run_phase("trace-driven points", grid, evaluate_fn, options, executor), quality


def execution_line(phase: Phase) -> str:
    r = phase.result
    cache = f"cache {r.cache_dir}" if r.cache_dir else "no cache"
    return (f"{phase.name}: {r.n_points:,} points, {r.n_computed:,} computed in {r.seconds:.2f} s "
            f"({r.points_per_s:,.0f} points/s), {r.n_cached:,} from the cache; {r.executor}; {cache}")
