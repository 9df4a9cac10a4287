"""One simulated serving run: `ServeConfig` (what to simulate) -> `run_config` -> `ServeResult`; the
Python entries `simulate(...)` and `simulate_row(mapping)` (sweeps). `python -m sim.serve` wraps them."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Mapping

from kvcommon.design import (CACHE_RATIO_RANGE, DEFAULT_CACHE_RATIO, DEFAULT_DTYPE, DEFAULT_POLICY, DEFAULT_PROFILE,
                             DEFAULT_RECENT_RATIO, RECENT_RATIO_RANGE)
from kvcommon.dtypes import DTYPES, dtype_name
from kvcommon.fields import at_least, in_range, param, same_as, validate
from sim import engine, kvlen
from sim.des.analytic import AnalyticTimer, PolicyKV, TraceKV, load_trace, memory_budget
from sim.des.arrivals import ARRIVAL_KINDS, make_workload
from sim.des.lengths import SPEC_HELP, LengthDist, check_spec
from sim.des.metrics import ServeResult, build_result
from sim.des.scheduler import ADMISSION_MODES, DEFAULT_WATERMARK, Scheduler, SchedulerConfig
from sim.des.server import ServingSimulation
from sim.parallel.shard import shard_model
from sim.parallel.timer import ParallelTimer
from sim.layouts import Layout, apply_layout

# Without chunked prefill, a prefill step takes at most this many tokens (vLLM v0's default
# max_num_batched_tokens is max(max_model_len, 2048); we use the longest request in place of max_model_len).
MIN_STEP_TOKENS = 2048


def _dist_name(spec) -> str:
    """A length-distribution spec in its canonical spelling ('lognormal:1.0' -> 'lognormal:1'); a bad one
    is left for the check to word."""
    try:
        return str(LengthDist.parse(spec))
    except ValueError:
        return spec


@dataclass(frozen=True)
class ServeConfig:
    """One simulated serving run. `hw` and `model` are names/paths (or loaded Device/ModelSpec objects)."""

    hw: Any
    model: Any
    policy: str = DEFAULT_POLICY
    # the design-point parameters keep kvcommon.DesignPoint's one default and one check each
    cache_ratio: float = param(DEFAULT_CACHE_RATIO, check=CACHE_RATIO_RANGE)
    recent_ratio: float = param(DEFAULT_RECENT_RATIO, check=RECENT_RATIO_RANGE)
    qps: float = param(math.inf, check=lambda v: None if v > 0 else "must be > 0 (or inf)")
    requests: int | None = 100
    prompt: int | None = None
    gen: int | None = None
    arrivals: str = "poisson"              # poisson | gamma | path of a CSV/JSONL replay file
    cv: float = 1.0                        # gamma arrivals: coefficient of variation of the gaps
    # per-request lengths drawn around prompt / gen (their means; sim.des.lengths): fixed | uniform:W | lognormal:S
    prompt_dist: str = param("fixed", check=check_spec, convert=_dist_name, metavar="DIST",
                             help="prompt lengths: " + SPEC_HELP)
    gen_dist: str = param("fixed", check=check_spec, convert=_dist_name, metavar="DIST",
                          help="output lengths: " + SPEC_HELP)
    seed: int = 0
    kv_dtype: str = param(DEFAULT_DTYPE, choices=DTYPES, convert=dtype_name)
    weight_dtype: str = param(DEFAULT_DTYPE, choices=DTYPES, convert=dtype_name)
    profile: str = DEFAULT_PROFILE
    # requests in flight (vLLM max_num_seqs); None = memory decides
    max_batch: int | None = param(None, check=at_least(1))
    # token budget per step; None = whole-prompt prefill steps
    chunked_prefill: int | None = param(None, check=at_least(1))
    # without chunking: prefill tokens per step (default below)
    max_step_tokens: int | None = param(None, check=at_least(1))
    # paged (on-demand blocks + recompute preemption) | reserve
    admission: str = param("paged", choices=ADMISSION_MODES)
    block_size: int = same_as(Layout, "block_size")            # tokens per KV block (sim.layouts)
    # fraction of device memory usable (vLLM --gpu-memory-utilization)
    memory_utilization: float = param(1.0, check=in_range(0, 1, low_open=True))
    watermark: float = param(DEFAULT_WATERMARK, check=in_range(0, 1, high_open=True))
    trace: Any = None                      # trace folder (or a loaded traces.Trace): per-request KV lengths
    trace_heads: str = param("mean", choices=("mean", "max"))   # max: a kernel padded to the fullest head
    # tensor / pipeline parallelism over the device's interconnect (sim.parallel); 1 x 1: one device
    tp: int = param(1, check=at_least(1))
    pp: int = param(1, check=at_least(1))
    # how the engine stores the trace's kept tokens (sim.layouts; its blocks are block_size tokens)
    layout: str = same_as(Layout, "name")
    compact_every: int | None = same_as(Layout, "compact_every")   # compaction interval in decode steps

    def __post_init__(self):
        """Errors name the field (`qps must be > 0 (or inf), got 0`); the CLI words them as flags."""
        kvlen.check_policy(self.policy)
        validate(self)
        if self.arrivals in ARRIVAL_KINDS and (self.prompt is None or self.gen is None or self.requests is None):
            raise ValueError(f"arrivals {self.arrivals} needs requests, prompt and gen")
        if (self.prompt_dist != "fixed" or self.gen_dist != "fixed") and self.arrivals not in ARRIVAL_KINDS:
            raise ValueError("prompt_dist and gen_dist draw synthetic lengths: a replay file gives its own")
        if not self.kv_layout.is_plain and self.trace is None:
            raise ValueError("layout and compact_every need a trace: the block accounting replays its kept positions")

    @property
    def kv_layout(self) -> Layout:
        return Layout(self.layout, self.block_size, self.compact_every)

    def to_dict(self) -> dict:
        """Plain values; a loaded Device/ModelSpec is recorded by its name."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for key in ("hw", "model"):
            if not isinstance(out[key], str):
                out[key] = getattr(out[key], "name", str(out[key]))
        if out["trace"] is not None and not isinstance(out["trace"], str):
            out["trace"] = str(getattr(out["trace"], "path", out["trace"]))
        if out["tp"] == 1 and out["pp"] == 1:      # one device: the outputs it always had (tests/golden)
            del out["tp"], out["pp"]
        for key in ("prompt_dist", "gen_dist"):    # fixed lengths: likewise
            if out[key] == "fixed":
                del out[key]
        if self.kv_layout.is_plain:                # per-head slots: likewise
            del out["layout"], out["compact_every"]
        return out


CONFIG_FIELDS = tuple(f.name for f in fields(ServeConfig))


def run_config(cfg: ServeConfig, *, progress: bool = False) -> ServeResult:
    """Build the workload, KV source, memory budget, scheduler and step timer of `cfg`; run; measure."""
    profile = cfg.profile
    workload = make_workload(cfg.arrivals, cfg.qps, cfg.requests, cfg.prompt, cfg.gen, cv=cfg.cv, seed=cfg.seed,
                             prompt_dist=cfg.prompt_dist, gen_dist=cfg.gen_dist)
    if cfg.trace is not None:
        # a paged layout: each request holds (and each step reads) the blocks its kept tokens keep alive
        trace, profile = apply_layout(load_trace(cfg.trace), cfg.kv_layout, cfg.profile)
    setup = engine.make_setup(cfg.hw, cfg.model, cfg.policy, cfg.weight_dtype, cfg.kv_dtype, profile)
    if cfg.trace is not None:
        kv = TraceKV(trace, cfg.policy, cfg.cache_ratio, setup.model.n_layers, cfg.trace_heads,
                     model=setup.model)
    else:
        kv = PolicyKV(cfg.policy, cfg.cache_ratio, setup.model)

    longest = int((workload.prompt_tokens + workload.output_tokens - 1).max())  # the longest (re)prefill
    step_tokens = cfg.chunked_prefill or cfg.max_step_tokens or max(MIN_STEP_TOKENS, longest)
    # Workspace for the largest step: the token budget, or without chunking at least the longest
    # prefill (it runs alone even when it exceeds max_step_tokens).
    workspace_tokens = step_tokens if cfg.chunked_prefill else max(step_tokens, longest)
    # tp x pp devices: the KV pool is one device's (its shard of the model), the steps sim.parallel's
    parallel = cfg.tp * cfg.pp > 1
    device_model = shard_model(setup.model, cfg.tp, cfg.pp) if parallel else setup.model
    budget = memory_budget(setup.hw, device_model, policy=cfg.policy, kv_dtype=cfg.kv_dtype,
                           weight_dtype=cfg.weight_dtype, profile=profile, step_tokens=workspace_tokens,
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
    timer_kw = dict(policy=cfg.policy, cache_ratio=cfg.cache_ratio, recent_ratio=cfg.recent_ratio,
                    weight_dtype=cfg.weight_dtype, kv_dtype=cfg.kv_dtype, profile=profile)
    timer = (ParallelTimer(setup.hw, setup.model, tp=cfg.tp, pp=cfg.pp, **timer_kw) if parallel
             else AnalyticTimer(setup.hw, setup.model, **timer_kw))
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

