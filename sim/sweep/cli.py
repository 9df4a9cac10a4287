"""`python -m sim.sweep`'s command line: flags over the YAML config, the phases, the outputs."""
from __future__ import annotations

import sys
import time
from dataclasses import asdict, fields
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from kvcommon import DesignPoint
from kvcommon.fields import add_flags, help_of
from kvcommon.variants import split_variants
from sim.des.serving import ServeConfig
from sim.des.slo import SLO
from sim import runner
from sim.cli import ArgumentParser, check_out_folder, csv_list, positive_int, staged_folder
from sim.parallel import cli as deployment
from sim.sweep.analytic import evaluate
from sim.sweep.des import evaluate_des, write_des_outputs
from sim.sweep.grid import GridConfig, build_grid
from sim.sweep.options import ENGINES, OWN, RunOptions, load_config
from sim.layouts import Layout
from sim.sweep.phases import execution_line, run_phase, trace_phase
from sim.sweep.summary import write_outputs

# Each grid axis (a GridConfig field) lists the values of one kvcommon.DesignPoint field.
AXIS_FIELDS = {"hw": "hw", "models": "model", "policies": "policy", "cache_ratios": "cache_ratio",
               "recent_ratios": "recent_ratio", "batches": "batch", "beams": "beams", "prompts": "prompt",
               "gens": "gen", "kv_dtypes": "kv_dtype", "weight_dtypes": "weight_dtype", "profiles": "profile"}
AXIS_HELP = {"hw": "devices (names or YAML files)", "models": "models (names or configs)", "policies": "policies or variants (keyformer:selection=official, h2o:recent_ratio=0.2)",
             "cache_ratios": "cache ratios", "recent_ratios": "recent ratios", "batches": "batch sizes",
             "beams": "beam widths", "prompts": "prompt lengths", "gens": "generation lengths",
             "kv_dtypes": "KV dtypes", "weight_dtypes": "weight dtypes", "profiles": "profiles"}
DESCRIPTION = "`python -m sim.sweep`: evaluate a grid of design points and write a table, plots and a summary."


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m sim.sweep", description=DESCRIPTION)
    p.add_argument("--config", help="YAML file with grid axes (keys as in GridConfig) and run options")
    p.add_argument("--out", help="output folder (default results/sweep-<UTC timestamp>)")
    d = GridConfig.__dataclass_fields__
    default = lambda name: ",".join(str(v) for v in d[name].default_factory()) if name != "hw" else "datasheet devices"
    for dest, field_name in AXIS_FIELDS.items():
        flag = "--" + dest.replace("_", "-")
        names = (flag, "--devices") if flag == "--hw" else (flag,)
        # policies: a comma inside a variant's `name:k=v,k=v` is the variant's (kvcommon.variants.split_variants)
        kind = split_variants if dest == "policies" else csv_list(_item_type(field_name), flag)
        p.add_argument(*names, dest=dest, type=kind, metavar="A,B,..",
                       help=f"{AXIS_HELP[dest]}, comma-separated (default {default(dest)})")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--csv", action="store_true",
                   help="also write points.csv beside points.parquet (about 9 MB for the default grid)")
    run_group = p.add_argument_group("execution (sim.runner)")
    run_group.add_argument("--workers", type=positive_int, metavar="N", help="local worker processes (default 1: this process)")
    run_group.add_argument("--scheduler", metavar="ADDRESS",
                           help="Dask scheduler address (tcp://host:8786): run the points on that cluster")
    run_group.add_argument("--cache-dir", metavar="DIR", help="per-point result cache (default .cache/sweep)")
    run_group.add_argument("--no-cache", action="store_true", help="compute every point, store nothing")
    run_group.add_argument("--engine", choices=ENGINES, help="analytic (default) or des (serving simulation per point)")
    run_group.add_argument("--qps", type=csv_list(float, "--qps"), metavar="RATE,..",
                           help="des: request rates, comma-separated, each a grid axis value (default inf: all at once)")
    run_group.add_argument("--requests", type=positive_int, metavar="N", help="des: requests per point (default 64)")
    add_flags(run_group, ServeConfig, ("prompt_dist", "gen_dist"), defaults={"prompt_dist": None, "gen_dist": None},
              help={k: f"des: {help_of(ServeConfig, k)} (default fixed)" for k in ("prompt_dist", "gen_dist")})
    run_group.add_argument("--workload", metavar="TRACE",
                           help="des: replay a request trace at every point (azure-code-2023, azure-conv-2023 or a "
                                "CSV/JSONL file); --qps then time-scales it (default: as recorded), the SLO search "
                                "scales its rate, and the prompts / gens axes are its mean lengths")
    run_group.add_argument("--window", metavar="START:END", help=f"des: {help_of(ServeConfig, 'window')}")
    run_group.add_argument("--overlong", choices=("drop", "clip"), help=f"des: {help_of(ServeConfig, 'overlong')}")
    add_flags(run_group, SLO, ("slo_ttft_p99", "slo_tpot_p99"),
              help={k: f"des: {help_of(SLO, k)}; adds the column max_qps_slo (the highest rate meeting the SLO) "
                       "and a summary table" for k in ("slo_ttft_p99", "slo_tpot_p99")})
    trace_group = p.add_argument_group("trace-driven points (measured KV lengths and quality)")
    trace_group.add_argument("--traces", type=csv_list(str, "--traces"), metavar="DIR,..",
                             help="trace folders, 'bundled' (default: traces/data/) or 'none'")
    trace_group.add_argument("--trace-models", type=csv_list(str, "--trace-models"), metavar="M,..",
                             help="models to predict them for: 'own' (default: the model the trace ran) and/or names")
    for flag in ("--trace-prompts", "--trace-gens"):
        trace_group.add_argument(flag, type=csv_list(_own_or_int, flag), metavar="N,..",
                                 help="'own' (default: the trace's own lengths) and/or token counts")
    trace_group.add_argument("--trace-batches", type=csv_list(int, "--trace-batches"), metavar="B,..",
                             help="batch sizes for trace-driven points (default 1; throughput at the largest "
                                  "batch that fits is computed for every point)")
    trace_group.add_argument("--trace-layouts", type=csv_list(str, "--trace-layouts"), metavar="L,..",
                             help="KV layouts of the trace-driven points: slots (default), paged, paged-head; "
                                  "non-slot layouts replay the traces' kept positions (sim.layouts) and the "
                                  "summary gets the share of KV each layout frees")
    trace_group.add_argument("--trace-block-size", type=int, metavar="B", help="tokens per block (default 16)")
    trace_group.add_argument("--trace-compact-every", type=int, metavar="N",
                             help="compact paged layouts after the prefill and every N decode steps")
    deployment.add_flags(p, micro_batches=False, unset=True)
    return p


def energy_figure(config: GridConfig, options: RunOptions, out_dir: Path) -> Path:
    """energy_cost.png (+ .csv): energy per token and cost per million output tokens against the cache ratio,
    per device of the grid, each at the largest batch that fits, for the grid's first model and first evicting
    policy (first prompt, gen, dtypes and profile)."""
    from sim import energy_plot
    policy = next((p for p in config.policies if p != "full"), config.policies[0])
    frame = energy_plot.table(config.hw, config.models[0], policy, sorted(set(config.cache_ratios)),
                              prompt=config.prompts[0], gen=config.gens[0], tp=options.tp, pp=options.pp,
                              price=options.price_per_hour, weight_dtype=config.weight_dtypes[0],
                              kv_dtype=config.kv_dtypes[0], profile=config.profiles[0])
    frame.to_csv(out_dir / "energy_cost.csv", index=False)
    return energy_plot.plot(frame, out_dir / "energy_cost.png")


def _item_type(field_name: str):
    """The type of one value of an axis: that of the kvcommon.DesignPoint field it lists."""
    kind = str({f.name: f.type for f in fields(DesignPoint)}[field_name])
    return {"int": int, "float": float}.get(kind, str)


def _own_or_int(text: str):
    return OWN if text == OWN else int(text)


def write_layout_report(options: RunOptions, layouts, out_dir: Path, plots: bool = True) -> list[str]:
    """The share of KV each layout frees, from the sweep's traces that hold kept positions
    (sim.layouts_report): kv_freed_by_layout.csv (+ .png) in `out_dir`, and the summary's section."""
    from kvcommon.cli import atomic_write_text
    from sim import layouts_report
    traces_by_name = layouts_report.traces_with_kept(options.trace_dirs())
    table = layouts_report.freed_table(traces_by_name, [Layout()] + [lay for lay in layouts if not lay.is_plain])
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / "kv_freed_by_layout.csv", table.to_csv(index=False))
    if plots:
        layouts_report.plot(table, out_dir / layouts_report.FIGURE_NAME)
    return ["", "## KV memory freed by layout", "",
            "Share of the full cache's KV that each policy's eviction frees when the kept tokens are stored in "
            "each layout (sim.layouts: blocks are live while any head of the layer, or the head, keeps a token in "
            "them), from the traces' kept positions; mean over samples with 95% cluster-bootstrap intervals "
            "(kv_freed_by_layout.csv" + (f", {layouts_report.FIGURE_NAME}" if plots else "") + ").", "",
            layouts_report.markdown(table)]


def config_from_args(a) -> tuple[GridConfig, RunOptions]:
    base, base_options = load_config(a.config) if a.config else (GridConfig(), RunOptions())
    overrides = {f.name: getattr(a, f.name) for f in fields(GridConfig) if getattr(a, f.name, None) is not None}
    config = GridConfig(**{**asdict(base), **overrides}) if overrides else base
    run_overrides = {f.name: getattr(a, f.name) for f in fields(RunOptions) if getattr(a, f.name, None) is not None}
    if a.no_cache:
        run_overrides["cache_dir"] = None
    options = RunOptions(**{**asdict(base_options), **run_overrides})
    if options.workload is not None:     # the trace gives the lengths: the axes show its mean request
        given = [flag for flag, name in (("--prompts", "prompts"), ("--gens", "gens")) if getattr(a, name) is not None]
        if given:
            raise ValueError(f"--workload gives the request lengths: drop {', '.join(given)}")
        config = GridConfig(**{**asdict(config), "prompts": [options.mean_lengths[0]],
                               "gens": [options.mean_lengths[1]]})
    return config, options


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    config, options = config_from_args(a)
    out_dir = Path(a.out) if a.out is not None else Path("results") / f"sweep-{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}"
    check_out_folder("--out", a.out if a.out is not None else out_dir)   # `--out ""`, a file: refused before any work
    t0 = time.perf_counter()
    points = build_grid(config)
    options.trace_dirs()  # a wrong trace folder is a one-line error before any work
    grid_fn = evaluate_des if options.engine == "des" else evaluate
    if options.parallel:      # every point on tp x pp devices (sim.parallel): columns tp, pp join the inputs
        from sim.parallel.sweep import evaluate as parallel_evaluate
        points = points.assign(tp=options.tp, pp=options.pp)
        grid_fn = evaluate_des if options.engine == "des" else parallel_evaluate
    executor = runner.make_executor(options.workers, options.scheduler)
    phases = []
    try:
        phases.append(run_phase("design points", points, grid_fn, options, executor))
        if options.parallel and options.trace_dirs():
            print("note: trace-driven points are single-device; skipped with --tp/--pp", file=sys.stderr)
            traced_phase, quality = None, None
        else:
            traced_phase, quality = trace_phase(config, options, executor)
        # every output is written into a staging folder that becomes out_dir at the end: an interrupted
        # or failed write (a plot, a table) leaves no half set of files
        with staged_folder(out_dir, owned=("points.csv",)) as stage:
            table = write_sweep(a, config, options, points, phases, traced_phase, quality, stage)
    except KeyboardInterrupt:
        where = f" in {options.cache_dir}" if options.cache_dir else ""
        print(f"interrupted: nothing written to {out_dir}; finished points are saved{where}; rerun the same "
              "command to resume", file=sys.stderr)
        raise
    finally:
        if hasattr(executor, "close"):
            executor.close()
    print(f"{len(table):,} points in {phases[0].result.seconds:.2f} s ({len(points) / max(phases[0].result.seconds, 1e-9):,.0f} points/s, "
          f"{phases[0].result.n_cached:,} from cache); total {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    print(out_dir)
    return 0


def write_sweep(a, config: GridConfig, options: RunOptions, points, phases, traced_phase, quality,
                out_dir: Path) -> pd.DataFrame:
    """The sweep's table, plots and summary into `out_dir` (the staging folder); returns the table."""
    table = phases[0].table
    if options.wants_energy:  # computed fresh (the platform files are not part of a point's cache key)
        from sim.parallel.sweep import energy_columns
        table = pd.concat([table, energy_columns(table, options.price_per_hour)], axis=1)
    meta = dict(eval_s=phases[0].result.seconds, points_per_s=len(points) / max(phases[0].result.seconds, 1e-9),
                config=asdict(config), options=asdict(options), engine=options.engine,
                execution=[execution_line(p) for p in phases + ([traced_phase] if traced_phase else [])],
                code_version=runner.code_version())
    import sim.plots as plots
    plots.ENABLED = not a.no_plots   # set both ways: a module flag would otherwise outlive one main() call
    # unchanged figures are copied from the cache (drawing them is most of a warm rerun's time)
    plots.CACHE_DIR = Path(options.cache_dir) / "plots" if options.cache_dir else None
    if traced_phase is not None:
        from sim import tradeoff
        throughput = "tokens_per_s" if options.engine == "des" else "max_batch_tokens_per_s"
        joined = tradeoff.join_quality(traced_phase.table, quality)
        meta["tradeoff_md"] = tradeoff.write_tradeoff(joined, out_dir, throughput, plots=not a.no_plots)
    layouts = options.layouts()
    if traced_phase is not None and any(not lay.is_plain for lay in layouts):
        meta["layouts_md"] = write_layout_report(options, layouts, out_dir, plots=not a.no_plots)
    if options.engine == "des":
        write_des_outputs(table, out_dir, meta, csv=a.csv)
    else:
        write_outputs(table, out_dir, meta, csv=a.csv)
        if options.wants_energy and not a.no_plots:
            energy_figure(config, options, out_dir)
    return table

