"""Discrete-event simulation of one accelerator serving a request stream (vLLM-like continuous batching).

    python -m sim.serve --hw a100-80g-sxm --model mpt-7b --policy keyformer --cache-ratio 0.5 \\
        --qps 2 --requests 200 --prompt 4096 --gen 4096 --kv-dtype fp16 --weight-dtype fp16 [--json]

Every step is timed by sim.engine (the analytic operator model); memory, scheduling and metrics are in
sim.des. Metrics follow vLLM's benchmark_serving (docs/metrics.md). Python entry: `simulate(...)`.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from hwmodels.dtypes import canonical_dtype
from sim import cli, engine, kvlen
from sim.des.analytic import AnalyticTimer, PolicyKV, TraceKV, load_trace, memory_budget
from sim.des.arrivals import ARRIVAL_KINDS, make_workload
from sim.des.metrics import STAT_KEYS, ServeResult, build_result
from sim.des.scheduler import ADMISSION_MODES, DEFAULT_WATERMARK, Scheduler, SchedulerConfig
from sim.des.server import ServingSimulation

# Without chunked prefill, a prefill step takes at most this many tokens (vLLM v0's default
# max_num_batched_tokens is max(max_model_len, 2048); we use the longest request in place of max_model_len).
MIN_STEP_TOKENS = 2048


@dataclass(frozen=True)
class ServeConfig:
    """One simulated serving run. `hw` and `model` are names/paths (or loaded Device/ModelSpec objects)."""

    hw: Any
    model: Any
    policy: str = "full"
    cache_ratio: float = 1.0
    recent_ratio: float = 0.3
    qps: float = math.inf
    requests: int | None = 100
    prompt: int | None = None
    gen: int | None = None
    arrivals: str = "poisson"              # poisson | gamma | path of a CSV/JSONL replay file
    cv: float = 1.0                        # gamma arrivals: coefficient of variation of the gaps
    seed: int = 0
    kv_dtype: str = "bf16"
    weight_dtype: str = "bf16"
    profile: str = "fused"
    max_batch: int | None = None           # requests in flight (vLLM max_num_seqs); None = memory decides
    chunked_prefill: int | None = None     # token budget per step; None = whole-prompt prefill steps
    max_step_tokens: int | None = None     # without chunking: prefill tokens per step (default below)
    admission: str = "paged"               # paged (on-demand blocks + recompute preemption) | reserve
    block_size: int = 16                   # tokens per KV block
    memory_utilization: float = 1.0       # fraction of device memory usable (vLLM --gpu-memory-utilization)
    watermark: float = DEFAULT_WATERMARK
    trace: Any = None                      # trace folder (or a loaded traces.Trace): per-request KV lengths
    trace_heads: str = "mean"              # mean | max (a kernel padded to the fullest head)

    def __post_init__(self):
        kvlen.check_policy(self.policy)
        for name in ("kv_dtype", "weight_dtype"):
            object.__setattr__(self, name, canonical_dtype(getattr(self, name)))
        if not (0 < self.cache_ratio <= 1):
            raise ValueError(f"--cache-ratio must be in (0, 1], got {self.cache_ratio}")
        if not (0 <= self.recent_ratio <= 1):
            raise ValueError(f"--recent-ratio must be in [0, 1], got {self.recent_ratio}")
        if not (self.qps > 0):
            raise ValueError(f"--qps must be > 0 (or inf), got {self.qps}")
        if self.block_size < 1:
            raise ValueError(f"--block-size must be >= 1, got {self.block_size}")
        if not (0 < self.memory_utilization <= 1):
            raise ValueError(f"--memory-utilization must be in (0, 1], got {self.memory_utilization}")
        if self.admission not in ADMISSION_MODES:
            raise ValueError(f"--admission must be one of {', '.join(ADMISSION_MODES)}, got {self.admission!r}")
        if self.trace_heads not in ("mean", "max"):
            raise ValueError(f"--trace-heads must be mean or max, got {self.trace_heads!r}")
        if self.arrivals in ARRIVAL_KINDS and (self.prompt is None or self.gen is None or self.requests is None):
            raise ValueError(f"--arrivals {self.arrivals} needs --requests, --prompt and --gen")

    def to_dict(self) -> dict:
        """Plain values; a loaded Device/ModelSpec is recorded by its name."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for key in ("hw", "model"):
            if not isinstance(out[key], str):
                out[key] = getattr(out[key], "name", str(out[key]))
        if out["trace"] is not None and not isinstance(out["trace"], str):
            out["trace"] = str(getattr(out["trace"], "path", out["trace"]))
        return out


CONFIG_FIELDS = tuple(f.name for f in fields(ServeConfig))


def run_config(cfg: ServeConfig, *, progress: bool = False) -> ServeResult:
    """Build the workload, KV source, memory budget, scheduler and step timer of `cfg`; run; measure."""
    setup = engine.make_setup(cfg.hw, cfg.model, cfg.policy, cfg.weight_dtype, cfg.kv_dtype, cfg.profile)
    workload = make_workload(cfg.arrivals, cfg.qps, cfg.requests, cfg.prompt, cfg.gen, cv=cfg.cv, seed=cfg.seed)
    if cfg.trace is not None:
        kv = TraceKV(load_trace(cfg.trace), cfg.policy, cfg.cache_ratio, setup.model.n_layers, cfg.trace_heads,
                     model=setup.model)
    else:
        kv = PolicyKV(cfg.policy, cfg.cache_ratio, setup.model)

    longest = int((workload.prompt_tokens + workload.output_tokens - 1).max())  # the longest (re)prefill
    step_tokens = cfg.chunked_prefill or cfg.max_step_tokens or max(MIN_STEP_TOKENS, longest)
    # Workspace for the largest step: the token budget, or without chunking at least the longest
    # prefill (it runs alone even when it exceeds max_step_tokens).
    workspace_tokens = step_tokens if cfg.chunked_prefill else max(step_tokens, longest)
    budget = memory_budget(setup.hw, setup.model, policy=cfg.policy, kv_dtype=cfg.kv_dtype,
                           weight_dtype=cfg.weight_dtype, profile=cfg.profile, step_tokens=workspace_tokens,
                           memory_utilization=cfg.memory_utilization)
    block_bytes = cfg.block_size * budget.kv_bytes_per_token
    capacity_blocks = int(budget.kv_capacity_bytes // block_bytes)
    if capacity_blocks < 1:
        raise ValueError(
            f"{setup.model.name} does not fit on {setup.hw.name}: weights {budget.weight_bytes / 1e9:.1f} GB + "
            f"workspace {budget.workspace_bytes / 1e9:.1f} GB leave no KV memory of "
            f"{budget.usable_bytes / 1e9:.1f} GB usable")
    sched = Scheduler(workload, kv, SchedulerConfig(
        block_tokens=cfg.block_size, capacity_blocks=capacity_blocks, block_bytes=block_bytes,
        max_batch=cfg.max_batch, chunked_prefill=cfg.chunked_prefill,
        max_step_tokens=None if cfg.chunked_prefill else step_tokens,
        admission=cfg.admission, watermark=cfg.watermark))
    timer = AnalyticTimer(setup.hw, setup.model, policy=cfg.policy, cache_ratio=cfg.cache_ratio,
                          recent_ratio=cfg.recent_ratio, weight_dtype=cfg.weight_dtype, kv_dtype=cfg.kv_dtype,
                          profile=cfg.profile)
    sim = ServingSimulation(sched, timer, progress=progress,
                            progress_desc=f"serve {setup.model.name} {cfg.policy} on {setup.hw.name}")
    timeline, wall = sim.run()
    config = {**cfg.to_dict(), "workload": workload.source, "requests": len(workload),
              "kv_source": "trace" if cfg.trace else "formula", "step_tokens": step_tokens,
              "kv_bytes_per_token": budget.kv_bytes_per_token, "block_bytes": block_bytes,
              "kv_capacity_blocks": capacity_blocks, "workspace_bytes": budget.workspace_bytes,
              "device_memory_bytes": budget.device_bytes}
    if isinstance(kv, TraceKV):
        config["trace_samples"] = kv.n_samples
    return build_result(sched, timeline, config=config, weight_bytes=budget.weight_bytes,
                        workspace_bytes=budget.workspace_bytes, wall_s=wall)


def simulate(hw, model, policy: str = "full", cache_ratio: float = 1.0, *, progress: bool = False,
             **options) -> ServeResult:
    """Simulate one design point under load. Keyword options are the ServeConfig fields, e.g.
    `simulate("a100-80g-sxm", "mpt-7b", "keyformer", 0.5, qps=2, requests=100, prompt=4096, gen=4096)`."""
    unknown = sorted(set(options) - set(CONFIG_FIELDS))
    if unknown:
        raise ValueError(f"unknown serve option(s) {', '.join(unknown)}; expected {', '.join(CONFIG_FIELDS)}")
    return run_config(ServeConfig(hw=hw, model=model, policy=policy, cache_ratio=cache_ratio, **options),
                      progress=progress)


def simulate_row(point: Mapping[str, Any]) -> dict:
    """One sweep design point (a mapping with ServeConfig field names; other keys are ignored, and
    `batch` is taken as max_batch when max_batch is absent) -> flat result row (ServeResult.to_row)."""
    options = {k: point[k] for k in CONFIG_FIELDS if k in point and not _missing(point[k])}
    if "max_batch" not in options and not _missing(point.get("batch")):
        options["max_batch"] = int(point["batch"])
    for key in ("requests", "prompt", "gen", "max_batch", "chunked_prefill", "max_step_tokens", "seed", "block_size"):
        if key in options:
            options[key] = int(options[key])
    hw, model = options.pop("hw"), options.pop("model")
    return simulate(hw, model, **options).to_row()


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


# ---------------------------------------------------------------------------------------------------
# CLI

def _parser() -> argparse.ArgumentParser:
    p = cli.ArgumentParser(prog="python -m sim.serve", description=__doc__.split("\n\n")[0],
                           formatter_class=cli.DefaultsHelpFormatter)
    p.add_argument("--hw", required=True, help="device name (hwmodels list) or YAML path")
    p.add_argument("--model", required=True, help="model name (sim/models) or HF config.json path")
    p.add_argument("--policy", default="full", choices=kvlen.POLICIES)
    p.add_argument("--cache-ratio", type=float, default=1.0, help="KV budget k = ratio x prompt (evicting policies)")
    p.add_argument("--recent-ratio", type=float, default=0.3, help="recent window share of the budget")
    p.add_argument("--qps", type=float, default=math.inf, help="request rate (requests/s); inf = all at t=0")
    p.add_argument("--requests", type=int, default=None, help="number of requests (default: 100, or the whole file)")
    p.add_argument("--prompt", type=int, default=None, help="prompt tokens per request")
    p.add_argument("--gen", type=int, default=None, help="output tokens per request")
    p.add_argument("--arrivals", default="poisson", help="poisson | gamma | CSV/JSONL file (arrival_s, "
                   "prompt_tokens, output_tokens per row)")
    p.add_argument("--cv", type=float, default=1.0, help="gamma arrivals: coefficient of variation of the gaps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kv-dtype", default="bf16", help="KV-cache dtype (fp32 bf16 fp16 fp8 int8 int4)")
    p.add_argument("--weight-dtype", default="bf16", help="weight dtype (fp32 bf16 fp16 fp8 int8 int4)")
    p.add_argument("--profile", default="fused", help="operator profile (sim.profiles)")
    p.add_argument("--max-batch", type=int, default=None, help="max requests in flight (default: memory decides)")
    p.add_argument("--chunked-prefill", type=int, default=None, metavar="TOKENS",
                   help="chunked prefill with this token budget per step (decodes count one each)")
    p.add_argument("--max-step-tokens", type=int, default=None,
                   help="without chunking: prefill tokens per step (default max(2048, longest request))")
    p.add_argument("--admission", default="paged", choices=ADMISSION_MODES,
                   help="paged: on-demand KV blocks, recompute preemption; reserve: reserve each request's peak")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    p.add_argument("--memory-utilization", type=float, default=1.0, help="fraction of device memory usable")
    p.add_argument("--trace", default=None, metavar="DIR", help="captured trace folder: per-request KV lengths")
    p.add_argument("--trace-heads", default="mean", choices=("mean", "max"),
                   help="per layer, average the KV heads or take the fullest one")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--timeline", default=None, metavar="CSV",
                   help="write the per-step timeline (memory over time); its folder must exist")
    p.add_argument("--per-request", default=None, metavar="CSV", help="write one row per request")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def _write_csv(frame, path: str) -> None:
    cli.atomic_writer(Path(path), lambda tmp: frame.to_csv(tmp, index=False))


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
    gb = 1e9
    lines = [
        f"simulated serving: {c['model']} on {c['hw']}, policy {c['policy']} (cache ratio {c['cache_ratio']:g}), "
        f"{c['admission']} admission, KV from {c['kv_source']}",
        f"workload: {c['requests']} requests, {c['workload']}, qps {c['qps']:g}",
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
        f"{'KV peak / mean / capacity (GB)':32s}{res.peak_kv_bytes / gb:.2f} / {res.mean_kv_bytes / gb:.2f} / "
        f"{res.kv_capacity_bytes / gb:.2f}",
        f"{'peak memory (GB)':32s}{res.peak_memory_bytes / gb:.2f} of {c['device_memory_bytes'] / gb:.2f}",
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
    if args.arrivals in ARRIVAL_KINDS and args.requests is None:
        args.requests = 100
    for flag, path in (("--timeline", args.timeline), ("--per-request", args.per_request)):
        if path:
            cli.output_file(flag, path)
    if args.prompt is not None and args.gen is not None and args.prompt > 0 and args.gen > 0:
        from sim.models import load_model
        note = cli.check_context(load_model(args.model), args.prompt + args.gen, "--prompt + --gen")
        if note:
            print(f"warning: {note}", file=sys.stderr)
    estimate = run_estimate(args.requests, args.gen)
    if estimate:
        print(f"warning: {estimate}", file=sys.stderr)
    cfg = ServeConfig(
        hw=args.hw, model=args.model, policy=args.policy, cache_ratio=args.cache_ratio,
        recent_ratio=args.recent_ratio, qps=args.qps, requests=args.requests, prompt=args.prompt,
        gen=args.gen, arrivals=args.arrivals, cv=args.cv, seed=args.seed, kv_dtype=args.kv_dtype,
        weight_dtype=args.weight_dtype, profile=args.profile, max_batch=args.max_batch,
        chunked_prefill=args.chunked_prefill, max_step_tokens=args.max_step_tokens,
        admission=args.admission, block_size=args.block_size, memory_utilization=args.memory_utilization,
        trace=args.trace, trace_heads=args.trace_heads)
    res = run_config(cfg, progress=not args.no_progress)  # the bar goes to stderr, never into --json
    if args.timeline:
        _write_csv(res.timeline, args.timeline)
    if args.per_request:
        _write_csv(res.requests, args.per_request)
    print(json.dumps(_jsonable(res.to_dict())) if args.json else format_report(res))
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


if __name__ == "__main__":
    sys.exit(main())
