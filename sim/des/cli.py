"""`python -m sim.serve`'s command line (sim/serve.py runs it): flags -> ServeConfig -> one run -> a text
report or one JSON object, with optional timeline and per-request CSVs."""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

from kvcommon import DesignPoint, FieldError
from kvcommon.fields import add_flags, flag_of, help_of
from sim.layouts import Layout
from sim import cli, policies
from sim.des.arrivals import ARRIVAL_KINDS
from sim.des.metrics import STAT_KEYS, ServeResult
from sim.des.scheduler import ADMISSION_MODES
from sim.des.serving import ServeConfig, run_config
from sim.des.slo import SLO, find_max_qps
from sim.des.slo_runs import default_workers
from sim.parallel import cli as deployment
from sim.policies import variants

DESCRIPTION = "Discrete-event simulation of one accelerator serving a request stream (vLLM-like continuous batching)."


def _parser() -> argparse.ArgumentParser:
    p = cli.ArgumentParser(prog="python -m sim.serve", description=DESCRIPTION,
                           formatter_class=cli.DefaultsHelpFormatter)
    # the design-point flags come from kvcommon.DesignPoint's fields (one default, one check per parameter)
    # --policy takes variants, --cache-ratio is required but for full (sim.policies.variants: one rule, every CLI)
    add_flags(p, DesignPoint, ("hw", "model", "policy", "cache_ratio", "recent_ratio"), required=("hw", "model"),
              defaults={"cache_ratio": None, "recent_ratio": None},
              help={"policy": variants.policy_help(policies.NAMES), "cache_ratio": variants.CACHE_RATIO_HELP,
                    "recent_ratio": variants.RECENT_RATIO_HELP})
    p.add_argument("--qps", type=float, default=None, help="request rate (requests/s; default inf = all at t=0); "
                   "with --workload the rate its arrivals are time-scaled to (default: as recorded)")
    p.add_argument("--requests", type=cli.positive_int, default=None, help="number of requests (default: 100, or the whole file)")
    add_flags(p, ServeConfig, ("request_trace", "window", "max_model_len", "overlong", "step_grid"))
    add_flags(p, DesignPoint, ("prompt", "gen"), defaults={"prompt": None, "gen": None},
              help={"gen": "output tokens per request"})
    p.add_argument("--arrivals", default="poisson", help="poisson | gamma | CSV/JSONL file (arrival_s, "
                   "prompt_tokens, output_tokens per row)")
    p.add_argument("--cv", type=float, default=1.0, help="gamma arrivals: coefficient of variation of the gaps")
    p.add_argument("--seed", type=cli.non_negative_int, default=0, help="workload draws' random seed")
    add_flags(p, ServeConfig, ("prompt_dist", "gen_dist"))
    add_flags(p, DesignPoint, ("kv_dtype", "weight_dtype", "profile"))
    p.add_argument("--max-batch", type=cli.checked_int, default=None, help="max requests in flight (default: memory decides)")
    p.add_argument("--chunked-prefill", type=cli.checked_int, default=None, metavar="TOKENS",
                   help="chunked prefill with this token budget per step (decodes count one each)")
    p.add_argument("--max-step-tokens", type=cli.checked_int, default=None,
                   help="without chunking: prefill tokens per step (default max(2048, longest request))")
    p.add_argument("--admission", default="paged", choices=ADMISSION_MODES,
                   help="paged: on-demand KV blocks, recompute preemption; reserve: reserve each request's peak")
    p.add_argument("--block-size", type=cli.checked_int, default=16, help="tokens per KV block")
    p.add_argument("--memory-utilization", type=float, default=1.0, help="fraction of device memory usable")
    p.add_argument("--trace", default=None, metavar="DIR", help="captured trace folder: per-request KV lengths")
    p.add_argument("--trace-heads", default=None, choices=("mean", "max"),
                   help="with --trace: per layer, average the KV heads or take the fullest one (default mean)")
    add_flags(p, Layout, ("name", "compact_every"), help={"name": help_of(Layout, "name") + " (blocks of --block-size)"})
    slo = p.add_argument_group("SLO capacity search (sim.des.slo)")
    add_flags(slo, SLO, ("slo_ttft_p99", "slo_tpot_p99"))
    slo.add_argument("--find-max-qps", action="store_true",
                     help="search (over log qps) the highest request rate whose P99 TTFT and P99 TPOT meet the "
                          "--slo-* limits at steady state (warm-up excluded, run length doubled until the answer "
                          "is stable within 5%%); --qps is then not used and --requests sets the measured "
                          "requests of its first runs (default 200)")
    slo.add_argument("--slo-converge", type=float, default=None, metavar="TOL",
                     help="--find-max-qps: one run per rate, stopped once its P99s move by at most TOL (e.g. "
                          "0.05) when its measured requests double (up to 3,200), instead of rerunning the "
                          "bracket at doubled lengths (sim.des.slo_converge)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--timeline", default=None, metavar="CSV",
                   help="write the per-step timeline (memory over time); its folder must exist")
    p.add_argument("--per-request", default=None, metavar="CSV", help="write one row per request")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    deployment.add_flags(p, micro_batches=False, energy=False)
    return p


def serve_config(**fields) -> ServeConfig:
    """ServeConfig from the flags' values; a field's error is worded with its flag (`--qps must be > 0`)."""
    try:
        return ServeConfig(**fields)
    except FieldError as exc:
        raise exc.for_flag(flag_of(ServeConfig, exc.field)) from None


def _write_csv(frame, path: str) -> None:
    cli.atomic_writer(Path(path), lambda tmp: frame.to_csv(tmp, index=False))


def replay_lines(notes: dict | None) -> list[str]:
    """A replayed trace's overlong count (always shown, zero too) and its attribution."""
    if not notes or "overlong" not in notes:
        return [f"lengths: {notes['attribution']}"] if notes and notes.get("attribution") else []
    lines = [f"overlong requests (prompt + output > {notes['max_model_len']} tokens): "
             f"{notes['overlong_requests']} {'dropped' if notes['overlong'] == 'drop' else 'clipped'}"]
    if notes.get("attribution"):
        lines.append(f"trace: {notes['attribution']}")
    return lines


def _durations(stats: dict) -> list[str]:
    return [cli.duration(stats[k]) for k in STAT_KEYS]


# Output tokens the DES simulates per second of host time, roughly (benchmarks/serve_bench.py: 10,000
# requests x 512 tokens in 4-18 s on the development VM): for the up-front estimate of a long run.
DES_TOKENS_PER_S = 3e5
ESTIMATE_WARN_S = 60.0


def run_estimate(requests, gen) -> str | None:
    """A warning line when simulating `requests` x `gen` output tokens would take over a minute here."""
    if not requests or not gen:
        return None
    seconds = float(requests) * float(gen) / DES_TOKENS_PER_S
    if seconds < ESTIMATE_WARN_S:
        return None
    return (f"{requests:,} requests x {gen:,} output tokens: roughly {cli.duration(seconds)} to simulate "
            f"(the DES runs about {DES_TOKENS_PER_S:,.0f} output tokens/s here) and memory for every request; "
            "fewer --requests give the same steady-state statistics")


def format_report(res: ServeResult) -> str:
    c = res.config
    gib = 2**30     # GiB, as sim.predict prints memory
    lines = [
        f"simulated serving: {c['model']} on {c['hw']}, policy {c['policy']} (cache ratio {c['cache_ratio']:g}), "
        f"{c['admission']} admission, KV from {c['kv_source']}",
        f"workload: {c['requests']} requests, {c['workload']}"
        + (f", qps {c['qps']:g}" if c.get("qps") is not None else ""),
        *replay_lines(c.get("replay")),
        *([f"devices: tp {c['tp']} x pp {c['pp']} (KV capacity and memory per device)"] if "tp" in c else []),
        "",
        f"{'completed / dropped':32s}{res.completed} / {res.dropped}",
        f"{'preemptions':32s}{res.preemptions}",
        f"{'duration (s)':32s}{res.makespan_s:.3f}",
        f"{'request throughput (req/s)':32s}{res.requests_per_s:.3f}",
        f"{'output token throughput (tok/s)':32s}{res.tokens_per_s:.1f}",
        f"{'total token throughput (tok/s)':32s}{res.total_tokens_per_s:.1f}",
        f"{'mean batch (max)':32s}{res.mean_batch:.1f} ({res.max_batch_seen})",
        f"{'mean in flight (max)':32s}{res.mean_in_flight:.1f} ({res.max_in_flight})",
        f"{'busy fraction':32s}{res.busy_fraction:.3f} (prefill {res.busy_s['prefill']:.2f} s, decode "
        f"{res.busy_s['decode']:.2f} s, mixed {res.busy_s['mixed']:.2f} s)",
        f"{'KV peak / mean / capacity (GiB)':32s}{res.peak_kv_bytes / gib:.2f} / {res.mean_kv_bytes / gib:.2f} / "
        f"{res.kv_capacity_bytes / gib:.2f}",
        f"{'peak memory (GiB)':32s}{res.peak_memory_bytes / gib:.2f} of {c['device_memory_bytes'] / gib:.2f}",
        "",
        f"{'latency':14s}{'mean':>12s}{'p50':>12s}{'p90':>12s}{'p99':>12s}",
    ]
    for key, label in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "ITL"), ("e2e_s", "E2E"),
                       ("queue_s", "queueing")):
        lines.append(f"{label:14s}" + "".join(f"{v:>12s}" for v in _durations(getattr(res, key))))
    if res.dropped:
        lines.append("")
        lines.extend(f"dropped {n}: {reason}" for reason, n in res.to_dict()["drop_reasons"].items())
    lines.append(f"\n(simulated in {res.wall_s:.2f} s, {res.steps} steps)")
    return "\n".join(lines)


def _main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if not args.hw.strip():     # DesignPoint's check, which ServeConfig does not repeat
        raise cli.UserError("--hw must not be empty")
    if args.trace_heads is not None and args.trace is None:
        raise cli.UserError("--trace-heads picks how a trace's KV heads are read: add --trace")
    replay_flags(args)
    requested = args.requests     # --find-max-qps: measured requests per run at its first length
    if args.arrivals in ARRIVAL_KINDS and args.requests is None and args.request_trace is None:
        args.requests = 100
    for flag, path in (("--timeline", args.timeline), ("--per-request", args.per_request)):
        if path:
            cli.output_file(flag, path)
    if args.prompt is not None and args.gen is not None and args.prompt > 0 and args.gen > 0:
        from sim.models import load_model
        note = cli.check_context(load_model(args.model), args.prompt + args.gen, "--prompt + --gen")
        if note:
            print(f"warning: {note}", file=sys.stderr)
    estimate = run_estimate(args.requests, args.gen) if args.request_trace is None else None
    if estimate:
        print(f"warning: {estimate}", file=sys.stderr)
    if args.arrivals not in ARRIVAL_KINDS and (args.prompt_dist != "fixed" or args.gen_dist != "fixed"):
        raise cli.UserError("--prompt-dist / --gen-dist draw synthetic lengths: a replay file (--arrivals FILE) "
                            "gives its own")
    if args.arrivals in ARRIVAL_KINDS and args.request_trace is None and (args.prompt is None or args.gen is None) \
            and not _empirical(args):
        raise cli.UserError(f"--arrivals {args.arrivals} needs --requests, --prompt and --gen")
    variant, args.recent_ratio = variants.resolve(args.policy, policies.NAMES, args.recent_ratio)
    args.policy, args.cache_ratio = variant.label, variants.require_cache_ratio(variant, args.cache_ratio)
    from sim.profiles import resolve_profile_name
    args.profile = resolve_profile_name(args.profile, args.hw)   # `auto`: the device's default, named in outputs
    cfg = serve_config(
        hw=args.hw, model=args.model, policy=args.policy, cache_ratio=args.cache_ratio,
        recent_ratio=args.recent_ratio, qps=args.qps, requests=args.requests, prompt=args.prompt,
        gen=args.gen, arrivals=args.arrivals, cv=args.cv, seed=args.seed, prompt_dist=args.prompt_dist,
        gen_dist=args.gen_dist, kv_dtype=args.kv_dtype,
        weight_dtype=args.weight_dtype, profile=args.profile, max_batch=args.max_batch,
        chunked_prefill=args.chunked_prefill, max_step_tokens=args.max_step_tokens,
        admission=args.admission, block_size=args.block_size, memory_utilization=args.memory_utilization,
        trace=args.trace, trace_heads=args.trace_heads or "mean", tp=args.tp, pp=args.pp, layout=args.name,
        compact_every=args.compact_every, request_trace=args.request_trace, window=args.window,
        max_model_len=args.max_model_len, overlong=args.overlong, step_grid=args.step_grid)
    slo = _slo(args)
    if args.find_max_qps:
        return _search(cfg, slo, args, requested)
    if slo.given or args.slo_converge is not None:
        raise cli.UserError("--slo-ttft-p99 / --slo-tpot-p99 / --slo-converge set the limits of --find-max-qps: add it")
    try:
        # the bar goes to stderr, never into --json; the per-request CSV is written as requests finish
        res = run_config(cfg, progress=not args.no_progress, per_request=args.per_request)
    except FieldError as exc:   # e.g. the workload's requests: worded with the flag that set it
        raise exc.for_flag(flag_of(ServeConfig, exc.field)) from None
    if args.timeline:
        _write_csv(res.timeline, args.timeline)
    print(json.dumps(_jsonable(res.to_dict())) if args.json else format_report(res))
    return 0


def _empirical(args) -> bool:
    """Both lengths have a source: given, or the mean of an empirical distribution."""
    return all(getattr(args, name) is not None or str(getattr(args, f"{name}_dist")).startswith("empirical:")
               for name in ("prompt", "gen"))


def replay_flags(args) -> None:
    """--workload's flags: a trace replaces --arrivals and the length flags; --window and --max-model-len
    only mean something with one; --qps defaults to inf (synthetic) or the recorded rate (a trace)."""
    if args.request_trace is None:
        for flag, value in (("--window", args.window), ("--max-model-len", args.max_model_len)):
            if value is not None:
                raise cli.UserError(f"{flag} applies to a replayed trace: add --workload")
        if args.qps is None:
            args.qps = math.inf
        return
    given = [flag for flag, value, unset in (("--arrivals", args.arrivals, "poisson"), ("--prompt", args.prompt, None),
                                             ("--gen", args.gen, None), ("--prompt-dist", args.prompt_dist, "fixed"),
                                             ("--gen-dist", args.gen_dist, "fixed")) if value != unset]
    if given:
        raise cli.UserError(f"--workload {args.request_trace} gives the arrivals and lengths: drop {', '.join(given)}")


def _slo(args) -> SLO:
    try:
        return SLO(slo_ttft_p99=args.slo_ttft_p99, slo_tpot_p99=args.slo_tpot_p99)
    except FieldError as exc:
        raise exc.for_flag(flag_of(SLO, exc.field)) from None


def _search(cfg: ServeConfig, slo: SLO, args, requested: int | None) -> int:
    """--find-max-qps: the search's probes, the rate found, how steady state was decided, and the full
    report at the rate found."""
    if not slo.given:
        raise cli.UserError("--find-max-qps needs --slo-ttft-p99 and/or --slo-tpot-p99")
    if args.slo_converge is not None and not 0 < args.slo_converge < 1:
        raise cli.UserError(f"--slo-converge must be in (0, 1), got {args.slo_converge:g}")
    if cfg.arrivals not in ARRIVAL_KINDS:
        raise cli.UserError("--find-max-qps varies the request rate: use --arrivals poisson or gamma")
    try:
        # the rates on both cores (the answer is the serial search's, sim.des.slo_runs)
        found = find_max_qps(cfg, slo, requests=requested, workers=default_workers(), converge=args.slo_converge)
    except FieldError as exc:
        raise exc.for_flag(flag_of(ServeConfig, exc.field)) from None
    if args.json:
        out = {**found.to_dict(), "slo": {"ttft_p99_s": slo.slo_ttft_p99, "tpot_p99_s": slo.slo_tpot_p99},
               "config": found.at_max.config if found.at_max is not None else cfg.to_dict()}
        print(json.dumps(_jsonable(out)))
        return 0
    lines = [f"SLO capacity search: {slo.describe()}", found.criterion, "",
             f"{'qps':>12s}{'requests':>10s}{'P99 TTFT':>12s}{'P99 TPOT':>12s}  meets"]
    for p in found.probes:
        lines.append(f"{p.qps:>12.4g}{p.requests:>10d}{cli.duration(p.ttft_p99):>12s}{cli.duration(p.tpot_p99):>12s}  "
                     + ("yes" if p.ok else f"no ({p.problem})"))
    if args.slo_converge is not None:
        settled = (f"converged: both ends of the bracket, within {found.requests} measured requests" if found.stable
                   else f"not converged at both ends within {found.requests} measured requests")
    else:
        settled = (f"stable: the same bracket at {found.requests // 2} and {found.requests} measured requests"
                   if found.stable else f"not shown stable at {found.requests} measured requests")
    lines += ["", f"max qps meeting the SLO: {found.max_qps:.4g} req/s ({found.runs} simulations; {settled}; "
                  f"bound: {found.reason})"]
    if found.at_max is not None:
        lines += ["", format_report(found.at_max)]
    print("\n".join(lines))
    return 0


def main(argv=None) -> int:
    """`python -m sim.serve`: user mistakes print one `error: ...` line and return 2."""
    return cli.run(_main, argv)


def _jsonable(value):
    """Strict JSON: numpy scalars to Python, NaN (no completed request) to null, inf (qps) to "inf"."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, float) and math.isinf(value):
        return str(value)
    return value
