"""How a sweep runs (`RunOptions`: workers, cache, engine, traces) and the YAML file that holds both."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np

from sim.sweep.grid import GridConfig

def _read_yaml(path) -> dict:
    import yaml
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config {path} not found")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ValueError(f"config {path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ValueError(f"config {path}: expected a mapping of grid axes")
    return data


def load_config(path) -> tuple["GridConfig", "RunOptions"]:
    """A YAML file holds grid axes (GridConfig keys) and, optionally, how to run them (RunOptions keys:
    workers, scheduler, cache_dir, engine, traces, trace_*, qps, requests)."""
    data = _read_yaml(path)
    if "devices" in data and "hw" not in data:
        data["hw"] = data.pop("devices")
    grid_keys = {f.name for f in fields(GridConfig)}
    run_keys = {f.name for f in fields(RunOptions)}
    unknown = sorted(set(data) - grid_keys - run_keys)
    if unknown:
        raise ValueError(f"config {path}: unknown key {unknown[0]!r}; expected {', '.join(sorted(grid_keys | run_keys))}")
    try:
        grid = GridConfig(**{k: v for k, v in data.items() if k in grid_keys})
        options = RunOptions(**{k: v for k, v in data.items() if k in run_keys})
    except (ValueError, TypeError) as exc:
        raise ValueError(f"config {path}: {exc}") from None
    return grid, options



ENGINES = ("analytic", "des")
DEFAULT_REQUESTS = 64      # des: requests per serving run
OWN = "own"      # trace_models / trace_prompts / trace_gens: the trace's own model or lengths


def _own_or_positive(values, name):
    out = []
    for v in values:
        if v == OWN:
            out.append(OWN)
        elif isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name}: expected '{OWN}' or positive integers, got {v!r}")
        else:
            out.append(int(v))
    return out


def _rate(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str, np.integer, np.floating)):
        raise ValueError(f"qps must be numbers > 0 (or inf), got {value!r}")
    try:
        rate = float(value)
    except ValueError:
        raise ValueError(f"qps must be numbers > 0 (or inf), got {value!r}") from None
    if not rate > 0:
        raise ValueError(f"qps must be > 0 (or inf), got {rate}")
    return rate


def _rates(value):
    """One rate stays one float (the options the sweep always had); a list of several is a grid axis."""
    if isinstance(value, (list, tuple)):
        if not value:
            raise ValueError("qps: empty list")
        rates = list(dict.fromkeys(_rate(v) for v in value))
        return rates[0] if len(rates) == 1 else rates
    return _rate(value)


@dataclass
class RunOptions:
    """How to run a sweep (not what it contains): where, with which cache, with which engine, and
    which traces feed its trace-driven points. YAML files may hold these keys beside the grid axes."""
    workers: int = 1                      # > 1: that many local worker processes
    scheduler: str | None = None          # a Dask scheduler address: run the points on that cluster
    cache_dir: str | None = ".cache/sweep"   # None: no per-point cache
    engine: str = "analytic"              # analytic (sim.engine) | des (sim.serve, one serving run per point)
    traces: list = field(default_factory=lambda: ["bundled"])   # folders, "bundled", or [] / "none"
    trace_models: list = field(default_factory=lambda: [OWN])
    trace_prompts: list = field(default_factory=lambda: [OWN])
    trace_gens: list = field(default_factory=lambda: [OWN])
    trace_batches: list = field(default_factory=lambda: [1])
    # KV layouts of the trace-driven points (sim.layouts): slots and/or paged, paged-head (blocks of
    # trace_block_size tokens, compacted every trace_compact_every decode steps when set)
    trace_layouts: list = field(default_factory=lambda: ["slots"])
    trace_block_size: int = 16
    trace_compact_every: int | None = None
    # des: request rate(s) (inf: all requests at t=0); a list is a grid axis. With a workload: the rates its
    # arrivals are time-scaled to (default: the recorded rate)
    qps: float | list | None = None
    requests: int | None = None           # des: requests per serving run (default 64; a workload: all of them)
    # des: a request trace replayed at every point (sim.des.workload): a bundled name or a CSV/JSONL file
    workload: str | None = None
    window: str | None = None             # its requests arriving in START:END seconds
    overlong: str = "drop"                # requests past the model's context: drop | clip
    # des: per-request length distributions around each point's prompt / gen (sim.des.lengths)
    prompt_dist: str = "fixed"
    gen_dist: str = "fixed"
    # des: latency SLO; when set, each point also gets max_qps_slo (sim.des.slo's search)
    slo_ttft_p99: float | None = None
    slo_tpot_p99: float | None = None
    tp: int = 1                           # tensor-parallel devices per point (sim.parallel; columns tp, pp)
    pp: int = 1                           # pipeline stages per point
    energy: bool = False                  # analytic: energy and cost columns (sim.parallel.sweep.ENERGY_COLUMNS)
    price_per_hour: float | None = None   # USD per device-hour for the cost (default: each device's own)

    def __post_init__(self):
        if isinstance(self.workers, bool) or not isinstance(self.workers, (int, np.integer)) or self.workers < 1:
            raise ValueError(f"workers must be a positive integer, got {self.workers!r}")
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        for name in ("traces", "trace_models", "trace_prompts", "trace_gens", "trace_batches", "trace_layouts"):
            value = getattr(self, name)
            if isinstance(value, (str, int)):
                setattr(self, name, [value])
        if self.traces in (["none"], [None]):
            self.traces = []
        self.trace_prompts = _own_or_positive(self.trace_prompts, "trace_prompts")
        self.trace_gens = _own_or_positive(self.trace_gens, "trace_gens")
        self.trace_batches = _own_or_positive(self.trace_batches, "trace_batches")
        if OWN in self.trace_batches:
            raise ValueError("trace_batches: expected positive integers")
        self.layouts()     # a bad layout, block size or interval is a one-line error now
        if self.requests is not None and (isinstance(self.requests, bool) or not isinstance(
                self.requests, (int, np.integer)) or self.requests < 1):
            raise ValueError(f"requests must be a positive integer, got {self.requests!r}")
        recorded = self._check_workload() if self.workload is not None else math.inf
        if self.qps is not None:
            self.qps = _rates(self.qps)
        self._resolved_qps = _rates(recorded if self.qps is None else self.qps)   # None: inf, or a trace's recorded rate
        for name in ("tp", "pp"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not isinstance(self.energy, bool):
            raise ValueError(f"energy must be true or false, got {self.energy!r}")
        if self.price_per_hour is not None and not (isinstance(self.price_per_hour, (int, float))
                                                    and math.isfinite(self.price_per_hour) and self.price_per_hour >= 0):
            raise ValueError(f"price_per_hour must be a number >= 0, got {self.price_per_hour!r}")
        from sim.des.lengths import LengthDist
        for name in ("prompt_dist", "gen_dist"):
            try:
                setattr(self, name, str(LengthDist.parse(getattr(self, name))))
            except ValueError as exc:
                raise ValueError(f"{name} must be fixed, uniform:W or lognormal:S ({exc}), got {getattr(self, name)!r}") from None
        for name in ("slo_ttft_p99", "slo_tpot_p99"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not value > 0):
                raise ValueError(f"{name} must be a number > 0 (seconds), got {value!r}")
        if self.engine != "des":
            for name in ("prompt_dist", "gen_dist"):
                if getattr(self, name) != "fixed":
                    raise ValueError(f"{name} draws serving workloads: use --engine des")
            if self.slo is not None:
                raise ValueError("the SLO search runs serving simulations: use --engine des")
            if len(self.qps_values) > 1:
                raise ValueError("qps lists are a serving (des) axis: use --engine des")
        if (self.energy or self.price_per_hour is not None) and self.engine == "des":
            raise ValueError("energy columns are analytic (a static batch's operator tables): use --engine analytic")

    def _check_workload(self):
        """A replayed trace: des only, its own lengths; the default rate is the recorded one."""
        from sim.des.workload import OVERLONG_MODES, replay_workload
        if self.engine != "des":
            raise ValueError("workload replays a request trace in serving simulations: use --engine des")
        if self.prompt_dist != "fixed" or self.gen_dist != "fixed":
            raise ValueError("workload gives the request lengths: drop prompt_dist / gen_dist")
        if self.overlong not in OVERLONG_MODES:
            raise ValueError(f"overlong must be one of {', '.join(OVERLONG_MODES)}, got {self.overlong!r}")
        from kvcommon.fields import FieldError
        try:
            replay = replay_workload(self.workload, window=self.window, requests=self.requests)
        except FieldError as exc:
            raise ValueError(f"{exc.field} {exc.problem}, got {exc.value!r}") from None
        self.mean_lengths = (int(round(replay.prompt_tokens.mean())), int(round(replay.output_tokens.mean())))
        return replay.notes["recorded_qps"]

    @property
    def requests_per_run(self) -> int | None:
        """requests, else 64 (a workload: None, all of its requests)."""
        return self.requests if self.requests is not None or self.workload is not None else DEFAULT_REQUESTS

    @property
    def qps_values(self) -> list[float]:
        return self._resolved_qps if isinstance(self._resolved_qps, list) else [self._resolved_qps]

    @property
    def slo(self):
        """sim.des.slo.SLO of the limits given, or None."""
        if self.slo_ttft_p99 is None and self.slo_tpot_p99 is None:
            return None
        from sim.des.slo import SLO
        return SLO(slo_ttft_p99=self.slo_ttft_p99, slo_tpot_p99=self.slo_tpot_p99)

    @property
    def parallel(self) -> bool:
        return self.tp * self.pp > 1

    @property
    def wants_energy(self) -> bool:
        return self.energy or self.price_per_hour is not None

    def layouts(self) -> list:
        """The trace-driven points' layouts (sim.layouts.Layout), in the order given."""
        from sim.layouts import Layout
        from kvcommon.fields import FieldError
        out = []
        for name in self.trace_layouts:
            try:
                out.append(Layout() if name == "slots" else Layout(name, self.trace_block_size, self.trace_compact_every))
            except FieldError as exc:
                raise ValueError(f"trace_{'layouts' if exc.field == 'name' else exc.field}: {exc}") from None
        return list(dict.fromkeys(out))

    def trace_dirs(self) -> list[Path]:
        import traces
        dirs = []
        for entry in self.traces:
            if entry == "bundled":
                dirs += traces.catalog().traces
            else:
                path = Path(entry)
                if not (path / "manifest.json").is_file():
                    raise FileNotFoundError(f"trace folder {path} not found (no manifest.json)")
                dirs.append(path)
        return list(dict.fromkeys(p.resolve() for p in dirs))
