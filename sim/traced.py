"""Trace-driven design points: the KV length each layer holds at each decode step comes from a real
run (`traces.load(dir).kv_override(...)`) instead of the cache-ratio formula.

A trace folder holds one model's run of several policies x cache ratios. For each of them the grid
gets one point per device x batch x (prompt, gen) x dtypes x profile, predicted for the trace's own
model by default (so the measured quality and the predicted speed describe the same model), or for
any other model the config names (the trace's kept *fractions* mapped onto it; labelled as such).
Prompt and generation lengths default to the trace's own (median prompt, generated tokens), the
lengths its quality was measured at.

`trace_grid(...)` builds the points, `evaluate(points)` predicts them (pure, chunkable: the runner
can spread it over processes or a Dask cluster; each worker loads a trace once).
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from kvcommon.cli import atomic_write_text
from sim import engine
from sim.layouts import Layout, with_compaction
from sim.models import list_models, load_model, spec_from_config
from sim.tradeoff import trace_identity

OWN = "own"                      # "the trace's own model / lengths" in the config
TRACE_MODEL_PREFIX = "trace:"    # model cell for a trace's own model that is not a shipped name
PLAIN = Layout()                 # per-head slots, no compaction: what a point without a layout axis means


def trace_label(path) -> str:
    """A trace's name in tables and plots: its path below a `traces/data/` folder
    (`smollm2-135m/xsum`, also for a copy of that tree elsewhere), else its folder name."""
    parts = Path(path).resolve().parts
    for i in range(len(parts) - 2, 0, -1):
        if parts[i] == "data" and parts[i - 1] == "traces" and i + 1 < len(parts):
            return "/".join(parts[i + 1:])
    return parts[-1]


@lru_cache(maxsize=32)
def load_trace(path: str, identity: str | None = None):
    """traces.load, once per process and trace content (`identity` = trace_identity: a trace
    recaptured in place is reloaded, not served stale from this cache)."""
    import traces
    return traces.load(path)


def base_policy(label: str) -> str:
    """`keyformer(noise=gaussian)` -> `keyformer`: the engine times the policy, not its variant."""
    return label.split("(", 1)[0]


def _normalise(name: str) -> str:
    return name.lower().replace("_", "-").removesuffix("-instruct").removesuffix("-hf")


def trace_model(trace) -> tuple[str, object]:
    """(model cell, ModelSpec) of the model a trace was captured on.

    A shipped model of the same name wins (stable name, shared cache entries); else the HF config the
    manifest carries, referenced as `trace:<folder>` so worker processes can rebuild it."""
    info = trace.manifest.get("model", {})
    names = [str(info.get(k)) for k in ("sim_name", "name", "id", "path") if info.get(k)]
    shipped = {_normalise(m): m for m in list_models()}
    for name in names:
        key = _normalise(Path(name).name)
        if key in shipped:
            return shipped[key], load_model(shipped[key])
    config = info.get("config")
    if isinstance(config, dict):
        cell = TRACE_MODEL_PREFIX + str(Path(trace.path).resolve())
        return cell, spec_from_config(config, names[0] if names else Path(trace.path).name, str(trace.path))
    raise ValueError(f"trace {trace.path}: cannot tell which model it was captured on (manifest model "
                     f"{names or '?'} is not a shipped sim model and carries no config)")


def resolve_model(cell: str):
    if cell.startswith(TRACE_MODEL_PREFIX):
        path = cell[len(TRACE_MODEL_PREFIX):]
        return trace_model(load_trace(path, trace_identity(path)))[1]
    return load_model(cell)


def own_lengths(trace) -> tuple[int, int]:
    """Median prompt length and the number of generated tokens the trace ran (its quality's lengths)."""
    kv = trace.kv
    prompt = int(np.median(kv.groupby("sample")["prompt_len"].first()))
    gen = int(kv["step"].max()) + 2   # steps -1..S: the prefill predicts token 0, step s token s + 1
    return max(prompt, 1), max(gen, 1)


def _cached_record(cache_dir, name: str, build):
    """`build()` (a JSON-ready dict), kept in <cache_dir>/traces/<name>.json: a warm sweep reads no trace
    table. `name` holds the trace's content hash and the code version, so a recaptured trace or edited
    code recomputes it."""
    if cache_dir is None:
        return build()
    path = Path(cache_dir) / "traces" / f"{name}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        record = build()
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(record))
        return record


def trace_facts(trace_dir: Path, identity: str, cache_dir=None) -> dict:
    """What the grid needs of a trace: its own model (cell and content hash), every captured (policy label,
    cache ratio), its own lengths and whether it holds kept positions (cached by content hash)."""
    from sim.runner import code_version

    def build():
        trace = load_trace(str(Path(trace_dir).resolve()), identity)
        cell, spec = trace_model(trace)
        prompt, gen = own_lengths(trace)
        return {"cell": cell, "model_hash": spec.content_hash, "prompt": prompt, "gen": gen,
                "kept": trace.manifest.get("detail", "full") == "full",
                "pairs": [[label, float(ratio)] for label in trace.policies for ratio in trace.cache_ratios(label)]}
    return _cached_record(cache_dir, f"{identity}-{code_version()[:12]}-facts", build)


def trace_quality(trace_dir: Path, identity: str, cache_dir=None) -> pd.DataFrame:
    """sim.tradeoff.measured_quality of a trace (cached by the trace's and its quality report's content)."""
    import hashlib
    from sim.runner import code_version
    from sim.tradeoff import measured_quality
    report = Path(trace_dir) / "quality" / "quality.csv"
    report_hash = hashlib.sha256(report.read_bytes()).hexdigest()[:12] if report.is_file() else "none"

    def build():
        frame = measured_quality(load_trace(str(Path(trace_dir).resolve()), identity), trace_label(trace_dir))
        return {"columns": list(frame.columns), "dtypes": [str(t) for t in frame.dtypes],
                "rows": frame.astype(object).where(frame.notna(), None).values.tolist()}
    record = _cached_record(cache_dir, f"{identity}-{report_hash}-{code_version()[:12]}-quality", build)
    frame = pd.DataFrame(record["rows"], columns=record["columns"])
    return frame.astype(dict(zip(record["columns"], record["dtypes"])))


def trace_grid(config, trace_dirs, models=(OWN,), prompts=(OWN,), gens=(OWN,), batches=None,
               layouts=(PLAIN,), cache_dir=None) -> pd.DataFrame:
    """Points for every trace x its captured (policy, cache ratio) x config devices, dtypes, profiles.

    A captured policy (or variant, e.g. `keyformer(noise=none)`) is kept when it or its base policy is in
    `config.policies`."""
    from hwmodels import load_device
    from sim import sweep
    devices = {name: load_device(name) for name in config.hw}
    frames = []
    for trace_dir in trace_dirs:
        trace_dir = Path(trace_dir)
        identity = trace_identity(trace_dir)
        facts = trace_facts(trace_dir, identity, cache_dir)
        own_prompt, own_gen = facts["prompt"], facts["gen"]
        targets = [(facts["cell"], facts["model_hash"]) if m == OWN else (m, load_model(m).content_hash)
                   for m in models]
        # a captured variant is kept when the sweep names it or its base policy (every variant of it)
        pairs = [(label, ratio) for label, ratio in facts["pairs"]
                 if label in config.policies or base_policy(label) in config.policies]
        lengths = [(own_prompt if p == OWN else int(p), own_gen if g == OWN else int(g)) for p in prompts for g in gens]
        rows = [(hw, cell, label, ratio, recent, batch, beams, prompt, gen, kvd, wd, profile)
                for hw in config.hw for cell, _ in targets for label, ratio in pairs
                for recent in config.recent_ratios for batch in (batches or config.batches) for beams in config.beams
                for prompt, gen in lengths for kvd in config.kv_dtypes for wd in config.weight_dtypes
                for profile in config.profiles]
        frame = pd.DataFrame(rows, columns=sweep.INPUT_COLUMNS[:2] + ["policy_label"] + sweep.INPUT_COLUMNS[3:])
        frame.insert(2, "policy", frame["policy_label"].map(base_policy))
        frame["cache_ratio"] = frame["cache_ratio"].astype(float)
        frame["hw_hash"] = frame["hw"].map({n: d.content_hash for n, d in devices.items()})
        frame["model_hash"] = frame["model"].map(dict(targets))
        frame["trace"] = trace_label(trace_dir)
        frame["trace_path"] = str(trace_dir.resolve())
        frame["trace_hash"] = identity
        if list(layouts) != [PLAIN]:   # a layout axis: one copy of the points per layout
            kept = facts["kept"]
            parts = [frame.assign(layout=lay.name, block_size=lay.block_size, compact_every=lay.compact_every or 0)
                     for lay in layouts if kept or lay.is_plain]   # blocks need kept positions
            if not parts:
                continue
            frame = pd.concat(parts, ignore_index=True)
        frames.append(frame)
    if not frames:
        return pd.DataFrame(columns=sweep.INPUT_COLUMNS + ["policy_label", "hw_hash", "model_hash", "trace",
                                                           "trace_path", "trace_hash"])
    return pd.concat(frames, ignore_index=True)


@lru_cache(maxsize=16)
def layout_trace(trace_path: str, identity: str, layout: Layout):
    """(the trace in `layout`, copies per step) (sim.layouts; cached: the replay is the costly part)."""
    from sim.layouts import layout_trace as adjust
    return adjust(load_trace(trace_path, identity), layout)


@lru_cache(maxsize=4096)
def kv_override(trace_path: str, identity: str, label: str, cache_ratio: float, prompt: int, gen: int,
                n_layers: int, layout: Layout = PLAIN) -> np.ndarray:
    """The trace's kept tokens per step and layer for one target (cached: every device and batch of
    the same trace x policy x ratio x lengths x depth reuses it, across the chunks of a process); in a
    paged `layout`, the slots those tokens keep alive."""
    trace = load_trace(trace_path, identity) if layout.is_plain else layout_trace(trace_path, identity, layout)[0]
    override = trace.kv_override(label, cache_ratio, prompt=prompt, gen=gen, n_layers=n_layers)
    override.setflags(write=False)
    return override


def row_layout(row) -> Layout:
    """A trace-driven point's layout (points of a sweep without a layout axis have none: slots)."""
    name = getattr(row, "layout", "slots")
    if not isinstance(name, str) or name == "slots" and not _given(getattr(row, "compact_every", None)):
        return PLAIN
    every = getattr(row, "compact_every", None)
    return Layout(name, int(getattr(row, "block_size", 16)), int(every) if _given(every) else None)


def _given(value) -> bool:
    return value is not None and not (isinstance(value, float) and np.isnan(value)) and int(value) > 0


def evaluate(points: pd.DataFrame) -> pd.DataFrame:
    """Outputs (sim.sweep.OUTPUT_COLUMNS) for trace-driven points, one row per input row, same order.

    The engine takes one kv_override per call (see `kv_override` for its reuse)."""
    from hwmodels import load_device
    from sim import sweep
    points = points.reset_index(drop=True)
    results = []
    devices, specs = {}, {}
    for row in points.itertuples(index=False):
        if row.hw not in devices:
            devices[row.hw] = load_device(row.hw)
        if row.model not in specs:
            specs[row.model] = resolve_model(row.model)
        hw, spec = devices[row.hw], specs[row.model]
        layout = row_layout(row)
        override = kv_override(row.trace_path, row.trace_hash, row.policy_label, float(row.cache_ratio),
                               int(row.prompt), int(row.gen), spec.n_layers, layout)
        profile = row.profile if layout.is_plain else \
            with_compaction(row.profile, layout_trace(row.trace_path, row.trace_hash, layout)[1])
        r = engine.evaluate(hw, spec, row.policy, batch=row.batch, prompt=row.prompt, gen=row.gen,
                            cache_ratio=row.cache_ratio, recent_ratio=row.recent_ratio, beams=row.beams,
                            kv_dtype=row.kv_dtype, weight_dtype=row.weight_dtype, profile=profile,
                            kv_override=override)
        out = {c: np.asarray(r[c]).ravel()[0] for c in sweep.OUTPUT_COLUMNS if c in r}
        out["weight_bytes"] = spec.weight_bytes(row.weight_dtype)
        out["device_memory_bytes"] = float(hw.memory_bytes)
        out["exceeds_max_positions"] = bool(spec.max_positions and row.prompt + row.gen > spec.max_positions)
        results.append(out)
    frame = pd.DataFrame(results, columns=sweep.OUTPUT_COLUMNS)
    dtypes = {c: float for c in sweep.OUTPUT_COLUMNS}
    dtypes.update(fits=bool, max_batch="int64", max_batch_all_at_once="int64", decode_bound=str,
                  exceeds_max_positions=bool)
    return frame.astype(dtypes)
