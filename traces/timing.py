"""Timing mode of the capture: decode-step (and prefill) latency of the project's own policies.

What it measures: the wall time of one `keyformer.generate.decode_one_token` call (embedding, every layer
with the policy's slot cache, attention, eviction bookkeeping, LM head, greedy pick) for a batch whose
requests each hold a context of `n` tokens, and optionally the wall time of a prefill. Models are built
from configs with *random* weights: latency does not depend on the weights' values, and this way any
shape can be timed without downloads. Long contexts need no prefill: `synthetic_state` builds the state a
prefill would leave (random K/V, policy bookkeeping initialised), so a 4096-token point costs a few
decode steps, not a 4096-token prefill.

    python -m traces.timing --model gpt2-small-rand --model llama-gqa-rand --model wide-mha-rand
    python -m traces.timing --model tiny-gpt2 --batch 1 --context 64 --policy full --out /tmp/t

Output, one trace-style folder per model under `--out` (default `traces/data/cpu`):
  manifest.json   kind "kvsim-timing": model config, environment (threads, OMP_WAIT_POLICY, versions,
                  CPU), grid settings, and `hw_device`, the hwmodels file the points are predicted on
  config.json     the HF config the model was built from (so `sim.models.load_model(folder)` reads it)
  timing.parquet  one row per point (schema in TIMING_COLUMNS), also timing.csv for humans and diffs
The folder is rewritten atomically after every point; an interrupted run keeps finished points and a
rerun measures only the missing ones (it refuses to mix points measured under different settings).

Rounds (`--rounds R`): the machine drifts (a shared VM's memory bandwidth moves by tens of percent over tens
of seconds), so a point measured once samples one phase. With R > 1 the grid is visited round-robin, every
model and point once per round, and each row's statistics are over the samples of all its rounds (raw
samples are kept, so a rerun with a higher R adds rounds). `--calibrate FILE.yaml` runs the hwmodels
microbenchmarks before every model of every round and writes FILE.yaml as their median: the hardware file then describes
the same phases the points saw (its inputs are still microbenchmarks only, never the points).

The Hugging Face stack (`--stack hf --beams 4`): the same folders, but each decode point is the wall time
of one step of transformers' own `generate` with beam search (DynamicCache growth by torch.cat, beam
reorder by index_select, eager attention), read between consecutive stopping-criteria calls; the manifest
names the `hf-eager` profile, so sim.validate predicts these points with it. No eviction policy exists
there (--policy full only) and every point pays a real prefill of batch x beams x context tokens.

    python -m traces.timing --stack hf --beams 4 --out traces/data/cpu-hf --rounds 3

Timing discipline: OMP_WAIT_POLICY=ACTIVE is set before torch loads (unless the caller set it), the thread
count is fixed (`--threads`, default 1: on a shared 2-core machine one thread is the setting whose timings
do not collapse when a neighbour takes a core), every point runs warm-up steps first and reports the
median over repeats (and p10/p90 so the spread is visible).
"""
from __future__ import annotations

import os

# Before torch (and its OpenMP runtime) loads: idle OpenMP threads otherwise sleep between small ops and
# the wake-up cost lands in every measured step.
os.environ.setdefault("OMP_WAIT_POLICY", "ACTIVE")

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from datetime import datetime, timezone  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from traces.assets import REPO_ROOT  # noqa: E402

SCHEMA_VERSION = 1
KIND = "kvsim-timing"
CONFIGS_DIR = REPO_ROOT / "traces" / "data" / "cpu" / "configs"
DEFAULT_OUT = REPO_ROOT / "traces" / "data" / "cpu"
DEFAULT_HF_OUT = REPO_ROOT / "traces" / "data" / "cpu-hf"
DEFAULT_MODELS = ("gpt2-small-rand", "llama-gqa-rand", "wide-mha-rand")
DEFAULT_BATCHES = (1, 2, 4, 8)
DEFAULT_CONTEXTS = (256, 1024, 4096)
DEFAULT_POLICIES = ("full", "keyformer:0.2", "keyformer:0.5", "keyformer:1.0")
DEFAULT_PREFILL = (64, 256)
STACKS = ("kvsim", "hf")
ATTN_IMPLEMENTATIONS = ("eager", "sdpa")
# the HF stack's defaults: every point pays a prefill of batch x beams x context tokens, so shorter contexts
HF_DEFAULTS = dict(batches=(1,), contexts=(256, 1024, 2048), policies=("full",), prefill=(), beams=4)
TORCH_DTYPES = ("fp32", "bf16", "fp16")

# One row per measured point. `kv_tokens` is what the simulator is fed: the mean number of tokens held per
# (request, KV head), averaged over layers and the timed steps, read from the policy (not assumed).
# `slots` is the cache buffer length attention actually ran over (>= kv_tokens: the slot cache keeps free
# slots for growth and for the incoming token).
KEY_COLUMNS = ("phase", "policy", "cache_ratio", "batch", "context")
# With --rounds, the statistics are over the samples of every round (`rounds` of them so far); the raw
# samples are kept (`samples_s`, `cpu_samples_s`: space-separated, `repeats` per round, round after round)
# so a resumed run can add rounds and recompute them; `round_medians_s` shows the drift between rounds.
TIMING_COLUMNS = KEY_COLUMNS + (
    "kv_tokens", "slots", "median_s", "p10_s", "p90_s", "mean_s", "min_s", "cpu_median_s", "peak_mem_bytes",
    "repeats", "warmup", "threads", "omp_wait_policy", "dtype", "load_1min", "measured_at",
    "rounds", "round_medians_s", "samples_s", "cpu_samples_s")


class TimingError(ValueError):
    """A user mistake or an unusable output folder: one line, shown as `error: ...` by the CLI."""


@dataclass(frozen=True)
class PolicyPoint:
    name: str  # a keyformer.make_policy name
    ratio: float  # KV budget as a fraction of the context (1.0 for full)

    @classmethod
    def parse(cls, text: str) -> "PolicyPoint":
        """`full`, `keyformer:0.5`, `h2o:0.2`, ... (ratio in (0, 1])."""
        name, _, ratio_text = text.strip().partition(":")
        if not name:
            raise TimingError(f"bad --policy {text!r}: expected NAME or NAME:RATIO, e.g. keyformer:0.5")
        if name == "full":
            if ratio_text and float(ratio_text) != 1.0:
                raise TimingError(f"bad --policy {text!r}: full keeps the whole context (ratio 1.0)")
            return cls("full", 1.0)
        if not ratio_text:
            raise TimingError(f"bad --policy {text!r}: {name} needs a ratio, e.g. {name}:0.5")
        try:
            ratio = float(ratio_text)
        except ValueError:
            raise TimingError(f"bad --policy {text!r}: ratio {ratio_text!r} is not a number") from None
        if not 0.0 < ratio <= 1.0:
            raise TimingError(f"bad --policy {text!r}: ratio must be in (0, 1]")
        return cls(name, ratio)

    def label(self) -> str:
        return self.name if self.name == "full" else f"{self.name}:{self.ratio:g}"


@dataclass(frozen=True)
class TimingGrid:
    batches: tuple[int, ...] = DEFAULT_BATCHES
    contexts: tuple[int, ...] = DEFAULT_CONTEXTS
    policies: tuple[PolicyPoint, ...] = tuple(PolicyPoint.parse(p) for p in DEFAULT_POLICIES)
    prefill_contexts: tuple[int, ...] = DEFAULT_PREFILL
    repeats: int = 7
    warmup: int = 2
    threads: int = 1
    dtype: str = "fp32"
    device: str = "cpu"
    seed: int = 0
    stack: str = "kvsim"     # "kvsim": keyformer/'s slot cache; "hf": transformers' generate (beam search)
    beams: int = 1
    attn: str = "eager"      # --stack hf: transformers' attention implementation ("sdpa": its default)

    def __post_init__(self):
        for name in ("batches", "contexts"):
            values = getattr(self, name)
            if not values or any(int(v) < 1 for v in values):
                raise TimingError(f"{name} must be positive integers, got {list(values)}")
        if any(int(v) < 2 for v in self.prefill_contexts):
            raise TimingError(f"prefill contexts must be >= 2 tokens, got {list(self.prefill_contexts)}")
        if self.repeats < 1 or self.warmup < 0:
            raise TimingError(f"need repeats >= 1 and warmup >= 0, got {self.repeats} and {self.warmup}")
        if self.threads < 1:
            raise TimingError(f"--threads must be >= 1, got {self.threads}")
        if self.dtype not in TORCH_DTYPES:
            raise TimingError(f"--dtype {self.dtype!r} not supported for timing (choose {', '.join(TORCH_DTYPES)})")
        if self.stack not in STACKS:
            raise TimingError(f"--stack {self.stack!r}: choose {' or '.join(STACKS)}")
        if self.beams < 1:
            raise TimingError(f"--beams must be >= 1, got {self.beams}")
        if self.stack == "kvsim" and self.beams != 1:
            raise TimingError("--beams needs --stack hf (the project's decode step is greedy)")
        if self.stack == "hf" and any(p.name != "full" for p in self.policies):
            raise TimingError("--stack hf times transformers' own cache, which evicts nothing: --policy full only")
        if self.stack == "hf" and self.prefill_contexts:
            raise TimingError("--stack hf times decode steps only: --prefill none")
        if self.attn not in ATTN_IMPLEMENTATIONS:
            raise TimingError(f"--attn {self.attn!r}: choose {' or '.join(ATTN_IMPLEMENTATIONS)}")
        if self.attn != "eager" and self.stack != "hf":
            raise TimingError("--attn sdpa needs --stack hf (the project's policies need eager attention)")

    def decode_points(self) -> list[dict]:
        return [dict(phase="decode", policy=p.name, cache_ratio=p.ratio, batch=int(b), context=int(n))
                for p in self.policies for n in self.contexts for b in self.batches]

    def prefill_points(self) -> list[dict]:
        # Prefill is timed under `full` at batch 1: the compute-bound regime the decode grid never reaches.
        return [dict(phase="prefill", policy="full", cache_ratio=1.0, batch=1, context=int(n))
                for n in self.prefill_contexts]

    def settings(self) -> dict:
        """What must match for points to be comparable (checked when resuming into an existing folder)."""
        settings = {"repeats": self.repeats, "warmup": self.warmup, "threads": self.threads,
                    "dtype": self.dtype, "device": self.device, "seed": self.seed}
        # only when not the default: folders measured before the HF stack existed keep resuming
        return (settings | ({"stack": self.stack, "beams": self.beams} if self.stack != "kvsim" else {})
                | ({"attn": self.attn} if self.attn != "eager" else {}))

    @property
    def software(self) -> str:
        """The sim profile of the code that runs: hf (transformers defaults: sdpa, greedy), hf-eager, kvsim-eager."""
        if self.stack != "hf":
            return "kvsim-eager"
        return "hf" if self.attn == "sdpa" and self.beams == 1 else "hf-eager"


# --- configs and models ------------------------------------------------------------------------------

def resolve_config(name_or_path: str) -> tuple[str, dict]:
    """(name, HF config dict): a CPU timing shape (traces/data/cpu/configs), a shipped sim model name,
    a path to a config.json or a folder holding one, or `tiny-gpt2`/`tiny-llama` for tests."""
    key = str(name_or_path)
    if key.startswith("tiny-"):
        return key, tiny_config(key)
    candidates = [CONFIGS_DIR / f"{key}.json"]
    try:
        from sim.models import MODELS_DIR
        candidates.append(MODELS_DIR / f"{key.lower()}.json")
    except ImportError:  # the simulator side is optional for capture
        pass
    path = next((c for c in candidates if "/" not in key and c.is_file()), Path(key).expanduser())
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        shapes = ", ".join(sorted(p.stem for p in CONFIGS_DIR.glob("*.json")))
        raise TimingError(f"model {key!r} not found: give a config.json path, a sim model name, or one of {shapes}")
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TimingError(f"{path}: not a readable JSON config ({exc})") from None
    if not isinstance(config, dict) or "model_type" not in config:
        raise TimingError(f"{path}: not an HF config (no model_type)")
    name = path.parent.name if path.name == "config.json" else path.stem
    return name, config


def tiny_config(name: str) -> dict:
    """Two-layer shapes for tests: they build and time in well under a second."""
    if name == "tiny-gpt2":
        return {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 256,
                "n_positions": 4096, "tie_word_embeddings": True, "bos_token_id": 0, "eos_token_id": 1,
                "_source": "kvsim tiny test shape (random weights)"}
    if name == "tiny-llama":
        return {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
                "max_position_embeddings": 4096, "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 1,
                "_source": "kvsim tiny test shape (random weights)"}
    raise TimingError(f"unknown tiny model {name!r} (choose tiny-gpt2 or tiny-llama)")


def build_model(config: dict, dtype: str, device: str, seed: int, attn: str = "eager"):
    """A random-weight causal LM of this config, eager attention (the policies need probabilities;
    `attn="sdpa"` for the plain transformers stack)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {k: v for k, v in config.items() if not k.startswith("_") and k not in ("architectures",)}
    model_type = fields.pop("model_type")
    try:
        hf_config = AutoConfig.for_model(model_type, **fields)
    except ValueError as exc:
        raise TimingError(f"cannot build a {model_type!r} model: {str(exc).splitlines()[0]}") from None
    hf_config._attn_implementation = attn
    torch.manual_seed(seed)
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    # Built directly on the device: a 7B model initialised on the CPU first would cost minutes.
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(hf_config, attn_implementation=attn, dtype=torch_dtype)
    return model.eval()


def max_positions(config: dict) -> int | None:
    """The model's position limit from its HF config (learned/rotary tables), None when it has none."""
    for key in ("n_positions", "max_position_embeddings", "n_ctx"):   # ALiBi (max_seq_len) extrapolates
        if isinstance(config.get(key), int):
            return config[key]
    return None


# --- measurement -------------------------------------------------------------------------------------

def _reset_peak(device: str) -> None:
    if device.startswith("cuda"):
        import torch
        torch.cuda.reset_peak_memory_stats(device)


def _peak(device: str) -> int:
    """Peak device memory allocated during the point (CUDA); -1 on the CPU, where torch does not track it."""
    if device.startswith("cuda"):
        import torch
        return int(torch.cuda.max_memory_allocated(device))
    return -1


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch
        torch.cuda.synchronize()


def make_project_policy(point: PolicyPoint):
    """The keyformer/ policy for a grid point (the project's own slot cache; nothing from HF's cache)."""
    from keyformer import make_policy
    if point.name == "full":
        return make_policy("full")
    return make_policy(point.name, cache_ratio=point.ratio)


def _held_tokens(policy) -> float:
    lengths = policy.kv_lengths()
    return float(np.mean(lengths)) if len(lengths) else 0.0


def _attended_slots(state) -> int:
    """Length of the K/V buffer attention runs over (layer 0; every layer has the same)."""
    cache = getattr(state, "cache", None)
    layers = getattr(cache, "layers", None)
    if layers:
        keys = getattr(layers[0], "keys", None)
        if keys is not None:
            return int(keys.shape[-2])
    return -1


def time_decode(model, point: PolicyPoint, batch: int, context: int, grid: TimingGrid) -> dict:
    """Median wall time of one decode step at (batch, context) under `point`'s policy."""
    import torch
    from keyformer.generate import decode_one_token, synthetic_state

    policy = make_project_policy(point)
    _reset_peak(grid.device)
    # The state keeps the policy applied to the model until it is closed: close it before the next point.
    with torch.inference_mode(), synthetic_state(model, policy, batch, context, seed=grid.seed) as state:
        for _ in range(grid.warmup):
            decode_one_token(state)
        times, cpu_times, held, slots = [], [], [], []
        for _ in range(grid.repeats):
            _sync(grid.device)
            started, cpu_started = time.perf_counter(), time.thread_time()
            decode_one_token(state)
            _sync(grid.device)
            times.append(time.perf_counter() - started)
            cpu_times.append(time.thread_time() - cpu_started)
            held.append(_held_tokens(policy))
            slots.append(_attended_slots(state))
    return _summary(times, cpu_times) | {"kv_tokens": float(np.mean(held)), "slots": int(np.max(slots)),
                                         "peak_mem_bytes": _peak(grid.device)}


def time_hf_decode(model, batch: int, context: int, grid: TimingGrid) -> dict:
    """Median wall time of one beam-search step of transformers' `generate` at (batch, context).

    A stopping criterion notes the clock once per step (after the step's forward and beam selection, before
    the cache reorder), so the time between two consecutive calls is one whole step: reorder, next
    forward over the grown DynamicCache, log-softmax and top-k. The first interval follows the prefill
    and the warm-up intervals are dropped."""
    import torch
    from transformers import StoppingCriteria, StoppingCriteriaList

    class StepClock(StoppingCriteria):
        def __init__(self):
            self.wall, self.cpu = [], []

        def __call__(self, input_ids, scores, **kwargs):
            _sync(grid.device)
            self.wall.append(time.perf_counter())
            self.cpu.append(time.thread_time())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    steps = grid.warmup + grid.repeats + 1
    generator = torch.Generator().manual_seed(grid.seed)
    input_ids = torch.randint(0, model.config.vocab_size, (batch, context), generator=generator).to(grid.device)
    clock = StepClock()
    _reset_peak(grid.device)
    with torch.inference_mode():
        model.generate(input_ids, attention_mask=torch.ones_like(input_ids), num_beams=grid.beams,
                       do_sample=False, max_new_tokens=steps, min_new_tokens=steps, early_stopping=False,
                       length_penalty=1.0, pad_token_id=0, stopping_criteria=StoppingCriteriaList([clock]))
    if len(clock.wall) != steps:
        raise TimingError(f"generate made {len(clock.wall)} steps, expected {steps}")
    times = np.diff(clock.wall)[grid.warmup:]
    cpu_times = np.diff(clock.cpu)[grid.warmup:]
    # interval c (1-based) ends with the forward of the token chosen at call c: context + c keys attended
    attended = context + grid.warmup + (grid.repeats + 1) / 2
    return _summary(list(times), list(cpu_times)) | {"kv_tokens": attended - 1, "slots": int(round(attended)),
                                                     "peak_mem_bytes": _peak(grid.device)}


def time_prefill(model, context: int, grid: TimingGrid) -> dict:
    """Median wall time of a full-attention prefill of `context` tokens at batch 1."""
    import torch
    from keyformer.generate import prefill

    generator = torch.Generator().manual_seed(grid.seed)
    vocab = model.config.vocab_size
    input_ids = torch.randint(0, vocab, (1, context), generator=generator).to(grid.device)
    attention_mask = torch.ones_like(input_ids)
    times, cpu_times = [], []
    _reset_peak(grid.device)
    with torch.inference_mode():
        for i in range(grid.warmup + grid.repeats):
            policy = make_project_policy(PolicyPoint("full", 1.0))
            _sync(grid.device)
            started, cpu_started = time.perf_counter(), time.thread_time()
            with prefill(model, policy, input_ids, attention_mask):
                _sync(grid.device)
                elapsed, cpu_elapsed = time.perf_counter() - started, time.thread_time() - cpu_started
            if i >= grid.warmup:
                times.append(elapsed)
                cpu_times.append(cpu_elapsed)
    return _summary(times, cpu_times) | {"kv_tokens": float(context), "slots": int(context),
                                         "peak_mem_bytes": _peak(grid.device)}


def _summary(times: list[float], cpu_times: list[float]) -> dict:
    """Wall-clock statistics (the measurement) plus the median CPU time of the calling thread: with one
    thread that is the step's own work, so a wall median well above it shows the point was disturbed
    by other processes (the report prints both)."""
    arr = np.asarray(times, dtype=float)
    return {"median_s": float(np.median(arr)), "p10_s": float(np.percentile(arr, 10)),
            "p90_s": float(np.percentile(arr, 90)), "mean_s": float(arr.mean()), "min_s": float(arr.min()),
            "cpu_median_s": float(np.median(cpu_times)),
            "samples_s": [float(t) for t in times], "cpu_samples_s": [float(t) for t in cpu_times]}


def _encode(values) -> str:
    """Samples as text (parquet and csv both keep it): repr round-trips every float exactly."""
    return " ".join(repr(float(v)) for v in values)


def _decode(text) -> list[float]:
    return [float(v) for v in text.split()] if isinstance(text, str) else []


def rounds_of(row: dict) -> int:
    """Rounds a row holds; a row written before rounds were recorded holds one."""
    value = row.get("rounds")
    return 1 if value is None or pd.isna(value) else int(value)


def add_round(previous: dict | None, point: dict, result: dict, repeats: int) -> dict:
    """The point's row after one more round: `result` (a time_decode/time_prefill dict, raw samples
    included) appended to the samples of `previous` (None for the first round), statistics recomputed
    over all of them."""
    wall = (_decode(previous["samples_s"]) if previous else []) + result["samples_s"]
    cpu = (_decode(previous["cpu_samples_s"]) if previous else []) + result["cpu_samples_s"]
    rounds = len(wall) // repeats
    medians = [float(np.median(wall[r * repeats:(r + 1) * repeats])) for r in range(rounds)]
    return point | result | _summary(wall, cpu) | {
        # the policy's bookkeeping is deterministic: kv_tokens is the same every round
        "slots": max(int(result["slots"]), int(previous["slots"]) if previous else -1),
        "peak_mem_bytes": max(int(result["peak_mem_bytes"]), int(previous["peak_mem_bytes"]) if previous else -1),
        "rounds": rounds, "round_medians_s": " ".join(f"{m:.6g}" for m in medians),
        "samples_s": _encode(wall), "cpu_samples_s": _encode(cpu)}


# --- the output folder -------------------------------------------------------------------------------

@dataclass
class TimingFolder:
    """One model's timing folder: loads finished points, appends new ones atomically."""
    path: Path
    rows: list[dict] = field(default_factory=list)
    manifest: dict = field(default_factory=dict)

    @classmethod
    def open(cls, path: Path, settings: dict, fresh: bool, rounds: int = 1) -> "TimingFolder":
        """Rounds are not a setting that must match: a higher --rounds adds rounds to finished points; a
        lower one is refused (the folder would mix points averaged over different numbers of rounds)."""
        folder = cls(Path(path))
        manifest_path = folder.path / "manifest.json"
        if fresh or not manifest_path.exists():
            return folder
        try:
            manifest = json.loads(manifest_path.read_text())
            table = pd.read_parquet(folder.path / "timing.parquet")
        except (OSError, ValueError) as exc:
            raise TimingError(f"{folder.path}: existing timing folder is unreadable ({exc}); "
                              "rerun with --fresh to start over") from None
        previous = manifest.get("grid_settings", {})
        # both ways: a setting only one side records (e.g. the HF stack's) is a difference too
        changed = {k: (previous.get(k), settings.get(k)) for k in dict.fromkeys([*settings, *previous])
                   if previous.get(k) != settings.get(k)}
        if changed:
            what = ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in changed.items())
            raise TimingError(f"{folder.path} was measured under other settings ({what}); "
                              "rerun with the same settings or with --fresh")
        before = int(manifest.get("rounds", 1))
        if rounds < before:
            raise TimingError(f"{folder.path} was measured with --rounds {before}; rerun with --rounds >= {before} "
                              "or with --fresh")
        folder.rows = table.to_dict("records")
        if rounds > 1 and any(not isinstance(r.get("samples_s"), str) for r in folder.rows):
            raise TimingError(f"{folder.path} holds points measured before samples were stored: more rounds "
                              "cannot be added to them; rerun with --fresh")
        folder.manifest = manifest
        return folder

    def done(self, rounds: int = 1) -> set[tuple]:
        """Keys of the points that hold at least `rounds` rounds."""
        return {_key(r) for r in self.rows if rounds_of(r) >= rounds}

    def row(self, point: dict) -> dict | None:
        return next((r for r in self.rows if _key(r) == _key(point)), None)

    def add(self, row: dict) -> None:
        self.rows = [r for r in self.rows if _key(r) != _key(row)] + [row]

    def write(self, manifest: dict, config: dict) -> None:
        """manifest.json, config.json, timing.parquet and timing.csv, each via a temp file + os.replace."""
        self.path.mkdir(parents=True, exist_ok=True)
        table = timing_table(self.rows)
        _atomic(self.path / "timing.parquet", lambda p: table.to_parquet(p, index=False))
        _atomic(self.path / "timing.csv", lambda p: table.to_csv(p, index=False, float_format="%.6g"))
        _atomic(self.path / "config.json", lambda p: Path(p).write_text(json.dumps(config, indent=2) + "\n"))
        manifest = manifest | {"points": len(table)}
        _atomic(self.path / "manifest.json", lambda p: Path(p).write_text(json.dumps(manifest, indent=2) + "\n"))
        self.manifest = manifest


def timing_table(rows: list[dict]) -> pd.DataFrame:
    table = pd.DataFrame(rows, columns=list(TIMING_COLUMNS))
    return table.sort_values(["phase", "policy", "cache_ratio", "context", "batch"], ignore_index=True)


def _key(row: dict) -> tuple:
    return (row["phase"], row["policy"], round(float(row["cache_ratio"]), 6), int(row["batch"]), int(row["context"]))


def _atomic(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)


def environment(grid: TimingGrid) -> dict:
    import torch
    import transformers

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    env = {"omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", ""), "threads": torch.get_num_threads(),
           "cpu": cpu, "logical_cpus": os.cpu_count(), "python": platform.python_version(),
           "torch": torch.__version__, "transformers": transformers.__version__, "numpy": np.__version__,
           "load_average_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}
    if grid.device.startswith("cuda"):
        env["gpu"] = torch.cuda.get_device_name(grid.device)
    return env


@dataclass
class ModelRun:
    """One model of the grid across the rounds: its folder stays open (and its rows in memory) between them."""
    name: str
    config: dict
    folder: TimingFolder
    hw_device: str      # as the manifest names it (a hardware file: relative to the folder)


def open_run(name: str, config: dict, grid: TimingGrid, out: Path, hw_device: str, fresh: bool,
             rounds: int) -> ModelRun:
    folder = TimingFolder.open(out / name, grid.settings(), fresh, rounds)
    if hw_device.endswith((".yaml", ".yml")):   # a hardware file path: stored relative to the folder
        hw_device = os.path.relpath(Path(hw_device).resolve(), (out / name).resolve())
    return ModelRun(name, config, folder, hw_device)


def rounds_done(run: ModelRun, grid: TimingGrid, rounds: int) -> int:
    """Point-rounds of the grid already in the folder (for the progress bar)."""
    points = grid.prefill_points() + grid.decode_points()
    return sum(min(rounds_of(row), rounds) for row in (run.folder.row(p) for p in points) if row is not None)


def build_manifest(run: ModelRun, model, grid: TimingGrid, rounds: int, priority: str) -> dict:
    from sim.models import spec_from_config  # the same reader the simulator uses: shapes cannot drift
    spec = spec_from_config(run.config, run.name)
    return {
        "schema_version": SCHEMA_VERSION, "kind": KIND,
        "model": {"name": run.name, "source": run.config.get("_source", ""), "trained": False,
                  "n_params": int(sum(p.numel() for p in model.parameters())), "spec": spec.to_dict()},
        "hw_device": run.hw_device, "software": grid.software,
        "stack": grid.stack, "beams": grid.beams, "device": grid.device, "dtype": grid.dtype,
        "seed": grid.seed,
        "grid_settings": grid.settings(),
        "rounds": rounds,
        "grid": {"batches": list(grid.batches), "contexts": list(grid.contexts),
                 "policies": [p.label() for p in grid.policies], "prefill_contexts": list(grid.prefill_contexts)},
        "env": environment(grid) | {"scheduling": priority},
        "clock": "median_s etc.: time.perf_counter wall clock (synchronised on CUDA); cpu_median_s: "
                 "time.thread_time of the calling thread",
        "what": (f"median wall time of one {'beam-search' if grid.beams > 1 else 'greedy'} step (num_beams="
                 f"{grid.beams}, attn_implementation={grid.attn}) of transformers' "
                 "generate, between consecutive stopping-criteria calls, after a real prefill"
                 if grid.stack == "hf" else
                 "median wall time of one keyformer.generate.decode_one_token call from a synthetic_state "
                 "(phase decode) or of keyformer.generate.prefill (phase prefill)")
                + "; random weights; with rounds > 1, statistics over the samples of every round (the grid "
                  "is revisited round-robin)",
        "created": run.folder.manifest.get("created") or datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def measure_round(run: ModelRun, grid: TimingGrid, rnd: int, rounds: int, progress,
                  priority: str = "default") -> None:
    """Give every point of `grid` that holds fewer than `rnd` rounds one more round, written point by point."""
    import torch

    todo = [p for p in grid.prefill_points() + grid.decode_points() if _key(p) not in run.folder.done(rnd)]
    if not todo:
        return
    torch.set_num_threads(grid.threads)
    # Rebuilt every round (same seed, same weights): one model in memory at a time, whatever the grid.
    model = build_model(run.config, grid.dtype, grid.device, grid.seed, grid.attn)
    manifest = build_manifest(run, model, grid, rounds, priority)
    started, wall_before = time.time(), float(run.folder.manifest.get("wall_time_s", 0.0))
    for point in todo:
        progress.set_postfix_str(f"{run.name} round {rnd}/{rounds} {point['phase']} {point['policy']}:"
                                 f"{point['cache_ratio']:g} b{point['batch']} n{point['context']}")
        if point["phase"] == "prefill":
            result = time_prefill(model, point["context"], grid)
        elif grid.stack == "hf":
            result = time_hf_decode(model, point["batch"], point["context"], grid)
        else:
            result = time_decode(model, PolicyPoint(point["policy"], point["cache_ratio"]),
                                 point["batch"], point["context"], grid)
        run.folder.add(add_round(run.folder.row(point), point, result, grid.repeats) | {
            "repeats": grid.repeats, "warmup": grid.warmup, "threads": torch.get_num_threads(),
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", ""), "dtype": grid.dtype,
            "load_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan"),
            "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds")})
        manifest["wall_time_s"] = round(wall_before + time.time() - started, 1)
        run.folder.write(manifest, run.config)
        progress.update(1)


@dataclass
class RoundCalibration:
    """--calibrate FILE: the hwmodels.calibrate microbenchmarks before every model of every round, so the
    hardware file samples the same machine phases as the points (one calibration per round was not enough:
    a 20-second snapshot per 3-minute round caught 12 GB/s in one round and 15-16 GB/s in the next while the
    points' own speed moved by 5%); after the last round FILE is their merge (median per series and size).
    Each calibration stays in `folder`, so a resumed run calibrates only the blocks it has not done."""
    target: Path
    folder: Path        # <out>/calibration-rounds
    device: str         # "cpu" or "cuda"
    quick: bool
    threads: int
    calibrated: list = field(default_factory=list)
    kept: list = field(default_factory=list)

    def path(self, rnd: int, model: str) -> Path:
        return self.folder / f"round-{rnd}-{model}.yaml"

    def clear(self) -> None:
        """--fresh: an earlier run's calibrations belong to the points it measured."""
        for old in self.folder.glob("round-*.yaml"):
            old.unlink()

    def before_block(self, rnd: int, model: str, progress) -> None:
        """Calibrate right before `model`'s points of round `rnd` (unless an earlier run did)."""
        path = self.path(rnd, model)
        if path.is_file():
            self.kept.append(path)
            return
        import torch
        from hwmodels.calibrate.cli import measure, write_calibration
        from hwmodels.errors import HardwareFileError

        torch.set_num_threads(self.threads)   # calibrated with the thread count the points use
        self.folder.mkdir(parents=True, exist_ok=True)
        try:
            cal = measure(self.device, self.quick, os.environ.get("OMP_WAIT_POLICY", "unset"),
                          lambda label: progress.set_postfix_str(f"calibrate round {rnd} {model}: {label}"),
                          say=progress.write,
                          # the grid's own spinning threads keep the load average near their count
                          own_load=self.threads)
            write_calibration(cal, f"{self.target.stem}-round-{rnd}-{model}", path)
        except (RuntimeError, OSError, HardwareFileError) as exc:
            raise TimingError(f"calibration before round {rnd} ({model}) failed: "
                              f"{str(exc).splitlines()[0]}") from None
        self.calibrated.append(path)

    def merge(self, rounds: int, models: list[str]) -> str:
        from hwmodels.calibrate.merge import merge_files
        paths = [self.path(r, m) for r in range(1, rounds + 1) for m in models]
        try:
            merge_files(paths, self.target, self.target.stem)
        except (OSError, ValueError) as exc:
            raise TimingError(f"merging the round calibrations into {self.target} failed: {exc}") from None
        return (f"calibration: {len(self.calibrated)} run(s) now, {len(self.kept)} kept from an earlier run; "
                f"{self.target} = median over {len(paths)} calibration runs (before every model of every round)")


def measure_grid(models: list, grid: TimingGrid, out: Path, hw_device: str, fresh: bool, rounds: int,
                 progress, priority: str = "default", calibration: RoundCalibration | None = None) -> list:
    """Round-robin over the grid: round r visits every model and point once (a point holding fewer
    than r rounds gets one more) before round r+1 starts, so every point samples every phase of a
    drifting machine. Returns the runs (folders)."""
    runs = [open_run(name, config, grid, Path(out), hw_device, fresh, rounds) for name, config in models]
    if calibration is not None and fresh:
        calibration.clear()
    progress.update(sum(rounds_done(run, grid, rounds) for run in runs))
    for rnd in range(1, rounds + 1):
        for run in runs:
            if calibration is not None:
                calibration.before_block(rnd, run.name, progress)
            measure_round(run, grid, rnd, rounds, progress, priority)
    if calibration is not None:
        progress.write(calibration.merge(rounds, [run.name for run in runs]))
    return runs


# --- CLI ---------------------------------------------------------------------------------------------

def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line + exit 2, like every kvsim CLI
        raise TimingError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m traces.timing",
                description="Measure decode-step latency of the project's policies on random-weight models.")
    p.add_argument("--model", action="append", default=None,
                   help="CPU shape name (traces/data/cpu/configs), sim model name, or config.json path; "
                        f"repeatable (default: {', '.join(DEFAULT_MODELS)})")
    p.add_argument("--stack", default="kvsim", choices=STACKS,
                   help="kvsim: the project's policies on its slot cache (default); hf: steps of transformers' "
                        "own generate with beam search (full cache), predicted with the hf-eager profile")
    p.add_argument("--attn", default="eager", choices=ATTN_IMPLEMENTATIONS,
                   help="--stack hf: transformers' attention implementation (sdpa = its default; with --beams 1 "
                        "the folder is predicted under the hf profile, else hf-eager)")
    p.add_argument("--beams", type=int, default=None,
                   help=f"beam width for --stack hf (default {HF_DEFAULTS['beams']})")
    p.add_argument("--batch", type=_int_list, default=None,
                   help=f"comma-separated batch sizes (default {','.join(map(str, DEFAULT_BATCHES))}; "
                        f"--stack hf: {','.join(map(str, HF_DEFAULTS['batches']))})")
    p.add_argument("--context", type=_int_list, default=None,
                   help=f"comma-separated context lengths held before the timed step (default "
                        f"{','.join(map(str, DEFAULT_CONTEXTS))}; --stack hf: "
                        f"{','.join(map(str, HF_DEFAULTS['contexts']))})")
    p.add_argument("--policy", action="append", default=None,
                   help=f"NAME or NAME:RATIO, repeatable (default: {' '.join(DEFAULT_POLICIES)}; --stack hf: full)")
    p.add_argument("--prefill", type=lambda t: () if t in ("", "none") else _int_list(t),
                   default=None, help="prefill lengths timed at batch 1 ('none' to skip; default "
                                      f"{','.join(map(str, DEFAULT_PREFILL))}, none for --stack hf)")
    p.add_argument("--repeats", type=int, default=7, help="timed steps per point (median reported)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps before each point")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (recorded)")
    p.add_argument("--dtype", default="fp32", help="weights and KV dtype: fp32, bf16 or fp16")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    p.add_argument("--hw", default=None,
                   help="hwmodels device name or hardware YAML these points are predicted on (default for cpu: "
                        "traces/data/cpu/cpu-local-1t.yaml at 1 thread, else cpu-local)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="output root (default: traces/data/cpu for cpu, traces/data/cpu-hf for --stack hf)")
    p.add_argument("--fresh", action="store_true", help="discard finished points instead of resuming")
    p.add_argument("--rounds", type=int, default=1,
                   help="measure the grid round-robin this many times (every model and point once per round); "
                        "statistics over all rounds' samples. A higher value on a finished folder adds rounds")
    p.add_argument("--calibrate", type=Path, default=None, metavar="FILE.yaml",
                   help="run the hwmodels.calibrate microbenchmarks before every model of every round (kept in "
                        "<out>/calibration-rounds/) and write FILE.yaml, their merge, as the hardware file the "
                        "points are predicted on (replaces --hw)")
    p.add_argument("--quick-calibration", action="store_true",
                   help="with --calibrate: the quick plan (seconds, warm caches): for tests, not for predictions")
    p.add_argument("--high-priority", action="store_true",
                   help="autogroup nice -20 and nice -20 (Linux, root); with `setsid` in front, on a shared "
                        "machine one thread then keeps a core to itself")
    return p


def raise_priority() -> str:
    """Raise this process's scheduling share: autogroup nice -20 and nice -20 (Linux, root or CAP_SYS_NICE).

    On a shared machine with autogroup scheduling, `nice` alone only orders processes inside one session;
    the session's autogroup nice sets its share against every other session (start the command with
    `setsid` to give it a session of its own; Ctrl-C then no longer reaches it: stop it with `kill`).
    With one torch thread the measurement then keeps one core to itself (the other processes keep the
    rest), which `cpu_median_s` ~= `median_s` confirms. Returns what was achieved, for the manifest."""
    done = []
    try:
        Path("/proc/self/autogroup").write_text("-20")
        done.append("autogroup nice -20")
    except OSError:
        pass
    try:
        os.nice(-20 - os.nice(0))
        done.append("nice -20")
    except OSError:
        pass
    return ", ".join(done) or "unchanged (not permitted)"


ONE_THREAD_HW = REPO_ROOT / "traces" / "data" / "cpu" / "cpu-local-1t.yaml"


def default_hw(threads: int) -> str:
    """The CPU hardware file calibrated with the same thread count: bandwidth and FLOP rates depend on it.

    hwmodels' `cpu-local` is calibrated with torch's default threads; the one-thread calibration that the
    committed grid uses lives beside the grid (regenerate: docs/validation.md)."""
    if threads == 1 and ONE_THREAD_HW.is_file():
        return str(ONE_THREAD_HW)
    return "cpu-local"


def round_calibration(args, grid: TimingGrid, out: Path) -> RoundCalibration | None:
    """The --calibrate plan (None without it), its arguments checked."""
    if args.calibrate is None:
        if args.quick_calibration:
            raise TimingError("--quick-calibration needs --calibrate FILE.yaml")
        return None
    target = Path(args.calibrate)
    if args.hw is not None:
        raise TimingError("--calibrate FILE.yaml writes the hardware file the points are predicted on: drop --hw")
    from hwmodels.calibrate.cli import output_problem   # torch-free: the same checks as calibrate --out
    if target.parent.resolve() == Path(out).resolve():
        Path(out).mkdir(parents=True, exist_ok=True)     # the output root the run creates anyway
    problem = output_problem("--calibrate", target)
    if problem:
        raise TimingError(problem)
    if not target.stem or any(c.isspace() for c in target.stem):
        raise TimingError(f"--calibrate: the file name names the device; one word please, got {target.name!r}")
    device = "cuda" if grid.device.startswith("cuda") else "cpu"
    return RoundCalibration(target, out / "calibration-rounds", device, args.quick_calibration, grid.threads)


def _interrupt_on_term(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    # `kill` (SIGTERM) stops a background run as cleanly as Ctrl-C: finished points are already on disk.
    previous = signal.signal(signal.SIGTERM, _interrupt_on_term)
    try:
        return _main(argv)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _main(argv: list[str] | None) -> int:
    try:
        args = build_parser().parse_args(argv)
        hf = args.stack == "hf"
        grid = TimingGrid(batches=args.batch or (HF_DEFAULTS["batches"] if hf else DEFAULT_BATCHES),
                          contexts=args.context or (HF_DEFAULTS["contexts"] if hf else DEFAULT_CONTEXTS),
                          policies=tuple(PolicyPoint.parse(p) for p in (
                              args.policy or (HF_DEFAULTS["policies"] if hf else DEFAULT_POLICIES))),
                          prefill_contexts=args.prefill if args.prefill is not None else (
                              HF_DEFAULTS["prefill"] if hf else DEFAULT_PREFILL),
                          repeats=args.repeats, warmup=args.warmup, threads=args.threads, dtype=args.dtype,
                          device=args.device, seed=args.seed, stack=args.stack,
                          beams=args.beams if args.beams is not None else (HF_DEFAULTS["beams"] if hf else 1),
                          attn=args.attn)
        if args.device != "cpu" and (args.out is None or args.hw is None):
            raise TimingError("--device other than cpu needs --out (e.g. traces/data/h200) and --hw (e.g. h200)")
        out = args.out if args.out is not None else (DEFAULT_HF_OUT if hf else DEFAULT_OUT)
        if args.rounds < 1:
            raise TimingError(f"--rounds must be >= 1, got {args.rounds}")
        calibration = round_calibration(args, grid, Path(out))
        hw_device = str(args.calibrate) if calibration else (args.hw or default_hw(grid.threads))
        if hw_device.endswith((".yaml", ".yml")) and calibration is None:
            if not Path(hw_device).is_file():
                raise TimingError(f"--hw {hw_device}: no such hardware file")
        models = [resolve_config(m) for m in (args.model or DEFAULT_MODELS)]
        if args.device.startswith("cuda"):
            import torch
            if not torch.cuda.is_available():
                raise TimingError(f"--device {args.device}: no CUDA device here")
        priority = raise_priority() if args.high_priority else "default"
        longest = max(max(grid.contexts) + grid.warmup + grid.repeats + 1, max(grid.prefill_contexts, default=0))
        for name, config in models:
            limit = max_positions(config)
            if limit is not None and longest > limit:
                raise TimingError(f"model {name} has {limit} positions but the grid needs {longest} "
                                  f"(context {max(grid.contexts)} + {grid.warmup + grid.repeats + 1} steps): "
                                  "lower --context or raise the position limit in its config")
        for name, _ in models:   # refuse to mix settings before any bar or measurement starts
            TimingFolder.open(Path(out) / name, grid.settings(), args.fresh, args.rounds)
        from tqdm import tqdm
        total = args.rounds * len(models) * (len(grid.decode_points()) + len(grid.prefill_points()))
        with tqdm(total=total, desc="timing" if args.rounds == 1 else f"timing x{args.rounds} rounds", unit="pt",
                  file=sys.stderr, dynamic_ncols=True) as progress:
            runs = measure_grid(models, grid, Path(out), hw_device, args.fresh, args.rounds, progress, priority,
                                calibration)
            for run in runs:
                progress.write(f"{run.name}: {run.folder.path}")
    except (TimingError, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: finished points are saved; rerun the same command to resume", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
