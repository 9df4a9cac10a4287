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
from sim.des.request_log import RequestLog
from sim.des.scheduler import ADMISSION_MODES, DEFAULT_WATERMARK, Scheduler, SchedulerConfig
from sim.des.server import ServingSimulation
from sim.des.step_grid import GridDecodeTimer
from sim.des.workload import OVERLONG_MODES, check_window, replay_workload
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
    # with a request_trace: the rate it is time-scaled to (None: as recorded)
    qps: float | None = param(math.inf, check=lambda v: None if v > 0 else "must be > 0 (or inf)")
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
    # a request trace replayed as the workload (sim.des.workload): its arrival times and lengths
    request_trace: Any = param(None, flag="--workload", metavar="TRACE",
                               help="replay a request trace: azure-code-2023 | azure-conv-2023 (read from "
                                    "../shared/data) | a CSV/JSONL file (arrival time, prompt and output tokens "
                                    "per row); --qps time-scales its arrivals to that rate (default: as recorded)")
    window: str | None = param(None, check=check_window, metavar="START:END",
                               help="--workload: replay only the requests arriving in [START, END) seconds from "
                                    "the trace's first one (e.g. 0:600)")
    max_model_len: int | None = param(None, check=at_least(2), metavar="TOKENS",
                                      help="--workload: context limit of the served model (default: its max "
                                           "positions); longer requests are handled as --overlong says")
    overlong: str = param("drop", choices=OVERLONG_MODES,
                          help="--workload: requests with prompt + output over --max-model-len are dropped "
                               "(a server rejects them) or clipped to fit; their number is reported")
    # decode-step times interpolated on a grid of the mean KV length (sim.des.step_grid); None: every step exact
    step_grid: int | None = param(None, check=at_least(1), metavar="N",
                                  help="time decode steps on a grid of N points per doubling of the mean KV "
                                       "length, interpolated (relative error < 1e-4 at 64; long replays run "
                                       "several times faster); default: every step exact")

    def __post_init__(self):
        """Errors name the field (`qps must be > 0 (or inf), got 0`); the CLI words them as flags."""
        kvlen.check_policy(self.policy)
        validate(self)
        if self.request_trace is not None:
            self._check_replay()
        elif self.qps is None:
            raise ValueError("qps None (as recorded) needs a request_trace")
        elif self.window is not None:
            raise ValueError("window selects part of a request_trace: give one")
        self._empirical_means()
        if self.request_trace is None and self.arrivals in ARRIVAL_KINDS and (
                self.prompt is None or self.gen is None or self.requests is None):
            raise ValueError(f"arrivals {self.arrivals} needs requests, prompt and gen")
        if (self.prompt_dist != "fixed" or self.gen_dist != "fixed") and self.arrivals not in ARRIVAL_KINDS:
            raise ValueError("prompt_dist and gen_dist draw synthetic lengths: a replay file gives its own")
        if not self.kv_layout.is_plain and self.trace is None:
            raise ValueError("layout and compact_every need a trace: the block accounting replays its kept positions")

    def _check_replay(self):
        if self.arrivals != "poisson":
            raise ValueError("request_trace gives the arrivals: leave arrivals at its default")
        if self.prompt_dist != "fixed" or self.gen_dist != "fixed":
            raise ValueError("prompt_dist and gen_dist draw synthetic lengths: a request_trace gives its own")

    def _empirical_means(self):
        """An empirical length distribution without a prompt / gen: its mean is the length."""
        for name, role in (("prompt", "prompt"), ("gen", "output")):
            dist = LengthDist.parse(getattr(self, f"{name}_dist"))
            if getattr(self, name) is None and dist.kind == "empirical":
                object.__setattr__(self, name, dist.mean_length(role))

    def workload(self):
        """The requests this run serves (sim.des.arrivals.Workload)."""
        if self.request_trace is not None:
            return replay_workload(self.request_trace, qps=self.qps, window=self.window, requests=self.requests,
                                   max_model_len=self.context_limit(), overlong=self.overlong)
        return make_workload(self.arrivals, self.qps, self.requests, self.prompt, self.gen, cv=self.cv,
                             seed=self.seed, prompt_dist=self.prompt_dist, gen_dist=self.gen_dist)

    def context_limit(self) -> int | None:
        """max_model_len, else the model's max positions (None when unknown)."""
        if self.max_model_len is not None:
            return self.max_model_len
        from sim.models import load_model
        return getattr(load_model(self.model), "max_positions", None) or None

    @property
    def kv_layout(self) -> Layout:
        return Layout(self.layout, self.block_size, self.compact_every)

    def to_dict(self) -> dict:
        """Plain values; a loaded Device/ModelSpec is recorded by its name."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for key in ("hw", "model"):
            if not isinstance(out[key], str):
                out[key] = getattr(out[key], "name", str(out[key]))
        if out["request_trace"] is not None and not isinstance(out["request_trace"], str):
            out["request_trace"] = getattr(out["request_trace"], "name", str(out["request_trace"]))
        if out["trace"] is not None and not isinstance(out["trace"], str):
            out["trace"] = str(getattr(out["trace"], "path", out["trace"]))
        if out["tp"] == 1 and out["pp"] == 1:      # one device: the outputs it always had (tests/golden)
            del out["tp"], out["pp"]
        for key in ("prompt_dist", "gen_dist"):    # fixed lengths: likewise
            if out[key] == "fixed":
                del out[key]
        if self.kv_layout.is_plain:                # per-head slots: likewise
            del out["layout"], out["compact_every"]
        if out["step_grid"] is None:               # exact steps: likewise
            del out["step_grid"]
        if out["request_trace"] is None:           # synthetic arrivals: likewise
            for key in ("request_trace", "window", "max_model_len", "overlong"):
                del out[key]
        return out


CONFIG_FIELDS = tuple(f.name for f in fields(ServeConfig))


def run_config(cfg: ServeConfig, *, progress: bool = False, stop=None, per_request=None) -> ServeResult:
    """Build the workload, KV source, memory budget, scheduler and step timer of `cfg`; run; measure.
    `stop(scheduler, now)`: ends the run early when true (sim.des.server); `per_request`: a CSV path the
    per-request table is written to as requests finish (sim.des.request_log)."""
    from sim.profiles import resolve_profile_name
    profile = resolve_profile_name(cfg.profile, cfg.hw)      # `auto`: the device's default
    workload = cfg.workload()
    if cfg.trace is not None:
        # a paged layout: each request holds (and each step reads) the blocks its kept tokens keep alive
        trace, profile = apply_layout(load_trace(cfg.trace), cfg.kv_layout, profile)
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
            f"{setup.model.name} does not fit on {setup.hw.name}: weights {budget.weight_bytes / 2**30:.1f} GiB + "
            f"workspace {budget.workspace_bytes / 2**30:.1f} GiB leave no KV memory of "
            f"{budget.usable_bytes / 2**30:.1f} GiB usable")
    sched = Scheduler(workload, kv, SchedulerConfig(
        block_tokens=cfg.block_size, capacity_blocks=capacity_blocks, block_bytes=block_bytes,
        max_batch=cfg.max_batch, chunked_prefill=cfg.chunked_prefill,
        max_step_tokens=None if cfg.chunked_prefill else step_tokens,
        admission=cfg.admission, watermark=cfg.watermark))
    timer = _timer(setup, cfg, profile, parallel)
    log = RequestLog(per_request) if per_request else None
    sim = ServingSimulation(sched, timer, progress=progress, stop=stop, after_step=log and log.after_step,
                            progress_desc=f"serve {setup.model.name} {cfg.policy} on {setup.hw.name}")
    try:
        timeline, wall = sim.run()
        if log is not None:
            log.close(sched)
    finally:
        if log is not None and not log.closed:
            log.abort()
    config = {**cfg.to_dict(), "workload": workload.source, "requests": len(workload),
              "kv_source": "trace" if cfg.trace else "formula", "step_tokens": step_tokens,
              "kv_bytes_per_token": budget.kv_bytes_per_token, "block_bytes": block_bytes,
              "kv_capacity_blocks": capacity_blocks, "workspace_bytes": budget.workspace_bytes,
              "device_memory_bytes": budget.device_bytes}
    if isinstance(kv, TraceKV):
        config["trace_samples"] = kv.n_samples
    if workload.notes:
        config["replay"] = workload.notes
    return build_result(sched, timeline, config=config, weight_bytes=budget.weight_bytes,
                        workspace_bytes=budget.workspace_bytes, wall_s=wall)


# Step timers of recent configurations: their memos (prefill steps, grid cells) are pure functions of the step,
# so runs of one configuration at other rates or lengths (the SLO search) reuse them exactly.
_TIMERS: dict = {}
MAX_TIMERS = 8


def _timer(setup, cfg: ServeConfig, profile: str, parallel: bool):
    timer_kw = dict(policy=cfg.policy, cache_ratio=cfg.cache_ratio, recent_ratio=cfg.recent_ratio,
                    weight_dtype=cfg.weight_dtype, kv_dtype=cfg.kv_dtype, profile=profile)
    key = (setup.hw, setup.model, cfg.tp, cfg.pp, cfg.step_grid, tuple(sorted(timer_kw.items())))
    try:
        hit = _TIMERS.get(key)
    except TypeError:       # an unhashable device or model object: no reuse
        key, hit = None, None
    if hit is not None:
        return hit
    timer = (ParallelTimer(setup.hw, setup.model, tp=cfg.tp, pp=cfg.pp, **timer_kw) if parallel
             else AnalyticTimer(setup.hw, setup.model, **timer_kw))
    if cfg.step_grid is not None:
        timer = GridDecodeTimer(timer, cfg.step_grid)
    if key is not None:
        if len(_TIMERS) >= MAX_TIMERS:
            _TIMERS.pop(next(iter(_TIMERS)))
        _TIMERS[key] = timer
    return timer


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

