"""What one GPU run measures and how long each stage may take (pure data, no torch).

Two plans: `full` (the issue-8 grid on a GPU: GPT-J-6B and MPT-7B shapes, bf16, batch 1 and 8, contexts
1k and 4k, full and Keyformer at 0.2 / 0.5 / 1.0) and `tiny` (the same stages and code paths with shapes
shrunk to two layers of width 64, so the whole run finishes in well under a minute on a CPU).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from traces.timing.configs import shipped_model_configs

STAGES = ("calibrate", "timing", "capture")
SIM_MODELS_DIR = shipped_model_configs()     # sim/models/*.json, found without importing sim
# Config keys that bound the positions a model can embed (learned or rotary tables), as traces.timing reads
# them; ALiBi (MPT's max_seq_len) extrapolates and is left alone.
POSITION_KEYS = ("n_positions", "max_position_embeddings", "n_ctx")
# Decode steps a timing point runs past its context (warm-up + repeats), plus slack.
POSITION_MARGIN = 256
# Datasheet hardware file per GPU name slug: the fallback when calibration fails, and the comparison the
# ingest step reports beside the calibrated file.
DATASHEETS = {"h200": "h200-sxm", "h100": "h100-sxm", "a100": "a100-80g-sxm", "l40s": "l40s", "l4": "l4"}


@dataclass(frozen=True)
class CapturePlan:
    model: str
    dataset: str
    policies: tuple[str, ...]
    cache_ratios: tuple[float, ...]
    n: int
    max_new_tokens: int
    dtype: str

    def folder(self) -> str:
        """Where the trace lands inside the run folder, as traces/data/<model>/<dataset> does."""
        return f"traces/{self.model}/{self.dataset}"


@dataclass(frozen=True)
class Plan:
    name: str                         # "full" or "tiny"
    device: str                       # "cuda" or "cpu"
    calibrate_quick: bool
    models: tuple[str, ...]           # sim/models names
    shrink: dict                      # tiny: config overrides per model_type (empty for full)
    batches: tuple[int, ...]
    contexts: tuple[int, ...]
    policies: tuple[str, ...]         # traces.timing --policy labels
    prefill: tuple[int, ...]
    dtype: str
    repeats: int
    warmup: int
    capture: CapturePlan
    total_s: float                    # the whole run, packing included
    caps_s: dict = field(default_factory=dict)      # stage -> most seconds it may take
    reserve_s: dict = field(default_factory=dict)   # stage -> seconds kept free for it by earlier stages
    pack_reserve_s: float = 15.0

    def __post_init__(self):
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device must be cpu or cuda, got {self.device!r}")
        if set(self.caps_s) != set(STAGES) or set(self.reserve_s) != set(STAGES):
            raise ValueError(f"every stage ({', '.join(STAGES)}) needs a time cap and a reserve")
        if self.total_s <= self.pack_reserve_s:
            raise ValueError(f"a total budget of {self.total_s:g} s leaves no time for the stages")

    def timing_argv(self) -> list[str]:
        """The grid part of a traces.timing command line."""
        argv = ["--batch", ",".join(map(str, self.batches)), "--context", ",".join(map(str, self.contexts)),
                "--prefill", ",".join(map(str, self.prefill)) if self.prefill else "none",
                "--dtype", self.dtype, "--device", self.device,
                "--repeats", str(self.repeats), "--warmup", str(self.warmup)]
        for policy in self.policies:
            argv += ["--policy", policy]
        return argv

    def points_per_model(self) -> int:
        return len(self.batches) * len(self.contexts) * len(self.policies) + len(self.prefill)

    def to_dict(self) -> dict:
        return {"name": self.name, "device": self.device, "calibrate_quick": self.calibrate_quick,
                "models": list(self.models), "batches": list(self.batches), "contexts": list(self.contexts),
                "policies": list(self.policies), "prefill": list(self.prefill), "dtype": self.dtype,
                "repeats": self.repeats, "warmup": self.warmup,
                "capture": {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.capture.__dict__.items()},
                "total_s": self.total_s, "caps_s": dict(self.caps_s), "reserve_s": dict(self.reserve_s)}


POLICIES = ("full", "keyformer:0.2", "keyformer:0.5", "keyformer:1.0")


def make_plan(device: str, tiny: bool, total_s: float | None = None) -> Plan:
    if device not in ("cpu", "cuda"):
        raise ValueError(f"--device must be cpu or cuda, got {device!r}")
    if device == "cpu" and not tiny:
        raise ValueError("--device cpu runs only the --tiny plan: the full grid is GPT-J-6B and MPT-7B in bf16 "
                         "at 4k contexts, hours on a CPU")
    if tiny:
        plan = Plan(
            # GPT-J's position limit of 48 < the 64-token context: the tiny run goes through the same limit
            # raising that GPT-J's 2048 positions need at 4096 tokens.
            name="tiny", device=device, calibrate_quick=True, models=("gpt-j-6b", "mpt-7b"),
            shrink={"gptj": {"n_embd": 64, "n_layer": 2, "n_head": 4, "rotary_dim": 8, "vocab_size": 512,
                             "bos_token_id": 0, "eos_token_id": 1, "n_positions": 48},
                    "mpt": {"d_model": 64, "n_layers": 2, "n_heads": 4, "vocab_size": 512}},
            batches=(1, 2), contexts=(32, 64), policies=POLICIES, prefill=(16,), dtype="bf16",
            repeats=3, warmup=1,
            capture=CapturePlan("stories260k", "tinystories", ("full", "keyformer"), (0.5, 1.0), n=2,
                                max_new_tokens=8, dtype="fp32"),
            # About a minute on a quiet 2-core machine, nearly all of it the four children importing torch and
            # transformers; the caps are loose so a machine shared with other work still finishes.
            total_s=total_s or 480.0,
            caps_s={"calibrate": 90.0, "timing": 240.0, "capture": 150.0},
            reserve_s={"calibrate": 10.0, "timing": 30.0, "capture": 60.0})
    else:
        # One H200: calibration ~20-40 s, two random 6-7B models x 34 points ~1-2 min each once built on the
        # GPU, the stories260K capture ~1 min. Caps keep the sum inside 450 s (7.5 min) whatever happens.
        plan = Plan(
            name="full", device=device, calibrate_quick=False, models=("gpt-j-6b", "mpt-7b"), shrink={},
            batches=(1, 8), contexts=(1024, 4096), policies=POLICIES, prefill=(256, 1024), dtype="bf16",
            repeats=10, warmup=3,
            # The first 6 samples, 32 new tokens, fp32, seed 0: the settings of the bundled CPU trace
            # (traces/data/stories260k/tinystories), so ingest can compare the two captures run by run.
            capture=CapturePlan("stories260k", "tinystories", ("full", "keyformer", "h2o"), (0.2, 0.5, 1.0),
                                n=6, max_new_tokens=32, dtype="fp32"),
            total_s=total_s or 450.0,
            caps_s={"calibrate": 90.0, "timing": 280.0, "capture": 120.0},
            reserve_s={"calibrate": 20.0, "timing": 60.0, "capture": 60.0})
    return plan


def timing_config(plan: Plan, model: str) -> dict:
    """The HF config a timing point is built from: the shipped sim model, shrunk for the tiny plan, with its
    position limit raised to cover the longest context (GPT-J ships n_positions=2048; traces.timing refuses a
    4096-token context on it, which would index past its rotary table). Both changes are noted in `_source`."""
    path = SIM_MODELS_DIR / f"{model}.json"
    if not path.is_file():
        raise FileNotFoundError(f"no shipped model config {path}")
    config = json.loads(path.read_text())
    notes = [config.get("_source", model)]
    shrink = plan.shrink.get(config["model_type"], {})
    if plan.shrink and not shrink:
        raise ValueError(f"the tiny plan has no shrunk shape for model type {config['model_type']!r}")
    if shrink:
        config.update(shrink)
        notes.append("tiny test shape: " + ", ".join(f"{k}={v}" for k, v in shrink.items()))
    needed = max(plan.contexts + plan.prefill) + POSITION_MARGIN
    for key in POSITION_KEYS:
        if key in config and int(config[key]) < needed:
            notes.append(f"{key} raised from {config[key]} to {needed} so the longest timed context fits "
                         "(random weights: the limit changes no cost)")
            config[key] = needed
    config["_source"] = "; ".join(notes)
    return config


def write_timing_configs(plan: Plan, folder: Path) -> dict[str, Path]:
    """Write one config per model into `folder` (named after the model: the timing folder takes its name)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for model in plan.models:
        path = folder / f"{model}.json"
        path.write_text(json.dumps(timing_config(plan, model), indent=2) + "\n")
        paths[model] = path
    return paths
