"""The models a timing grid runs: HF configs found by name (the CPU timing shapes, the simulator's shipped
models, a config.json path, the tiny test shapes) and built with random weights (keyformer.tiny's factory).
Model shapes come from the HF config alone: the folder keeps it as config.json, which sim reads."""
from __future__ import annotations

import json
from pathlib import Path

from kvcommon.paths import package_dir
from traces.assets import DATA_DIR
from traces.timing_format import TimingError

CONFIGS_DIR = DATA_DIR / "cpu" / "configs"
TINY_ARCHS = {"tiny-gpt2": "gpt2", "tiny-llama": "llama"}


def shipped_model_configs() -> Path | None:
    """The simulator's shipped model configs (sim/models/*.json), found without importing sim."""
    sim = package_dir("sim")
    return sim / "models" if sim is not None else None


def resolve_config(name_or_path: str) -> tuple[str, dict]:
    """(name, HF config dict): a CPU timing shape (traces/data/cpu/configs), a shipped sim model name,
    a path to a config.json or a folder holding one, or `tiny-gpt2`/`tiny-llama` for tests."""
    key = str(name_or_path)
    if key.startswith("tiny-"):
        return key, tiny_config(key)
    candidates = [CONFIGS_DIR / f"{key}.json"]
    shipped = shipped_model_configs()
    if shipped is not None:    # the simulator side is optional for capture
        candidates.append(shipped / f"{key.lower()}.json")
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
    """Two-layer shapes for tests (keyformer.tiny): they build and time in well under a second."""
    if name not in TINY_ARCHS:
        raise TimingError(f"unknown tiny model {name!r} (choose tiny-gpt2 or tiny-llama)")
    from keyformer.tiny import tiny_config as shape   # torch: only once a tiny model is asked for

    arch = TINY_ARCHS[name]
    extra = {"tie_word_embeddings": True} if arch == "gpt2" else {"tie_word_embeddings": False}
    return shape(arch, vocab_size=256, positions=4096, **extra, bos_token_id=0, eos_token_id=1,
                 _source="kvsim tiny test shape (random weights)")


def build_model(config: dict, dtype: str, device: str, seed: int, attn: str = "eager"):
    """A random-weight causal LM of this config, eager attention (the policies need probabilities;
    `attn="sdpa"` for the plain transformers stack)."""
    from keyformer.tiny import random_model
    try:
        return random_model(config, seed=seed, dtype=dtype, device=device, attn=attn)
    except ValueError as exc:
        raise TimingError(str(exc)) from None


def max_positions(config: dict) -> int | None:
    """The model's position limit from its HF config (learned/rotary tables), None when it has none."""
    for key in ("n_positions", "max_position_embeddings", "n_ctx"):   # ALiBi (max_seq_len) extrapolates
        if isinstance(config.get(key), int):
            return config[key]
    return None
