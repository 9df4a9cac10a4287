"""Published and Hugging Face model names -> shipped specs (sim/models/names.yaml holds the table and the rules).

    resolve_name("meta-llama/Llama-3.3-70B-Instruct")   -> Resolution(spec="llama-3.1-70b", ...)
    resolve_name("mistralai/Mixtral-8x7B-v0.1")         -> Resolution(spec="mixtral-8x7b", ...)
    resolve_name("deepseek-ai/DeepSeek-V3")             -> Resolution(spec=None, reason="a mixture-of-experts ...")

`sim.models.load_model` falls back to it for a name that is neither a shipped spec nor a path; the published-GPU
rows (sim/validation/published_gpu.py) map their `model` column with it. The shipped specs' folder and names
(MODELS_DIR, list_models) live here, below sim.models, which re-exports them.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

MODELS_DIR = Path(__file__).with_name("models")
NAMES_FILE = MODELS_DIR / "names.yaml"
# words that name a fine-tune or a quantisation, not a shape (the row's dtypes say the quantisation)
NEUTRAL_WORDS = frozenset({"instruct", "chat", "hf", "base", "it", "meta", "fp8", "kv", "awq", "gptq", "int4", "int8",
                           "w4a16", "w8a8", "fp16", "bf16"})


@dataclass(frozen=True)
class Resolution:
    label: str
    spec: str | None        # the shipped spec's name, None when there is none
    reason: str = ""        # how it matched, or why there is no spec


def normal_form(label: str) -> str:
    """Lower case, no "(...)" remark, no organisation, words joined by "-", shape-neutral words dropped."""
    text = re.sub(r"\([^)]*\)", " ", str(label)).strip().lower()
    text = text.rsplit("/", 1)[-1]
    text = re.sub(r"\bllama(\d)", r"llama-\1", text)
    words = [w for w in re.split(r"[-_\s]+", text) if w and w not in NEUTRAL_WORDS]
    return "-".join(words)


def list_models() -> list[str]:
    """The shipped specs' names (sim/models/*.json), sorted."""
    return sorted(p.stem for p in MODELS_DIR.glob("*.json"))


@lru_cache(maxsize=1)
def _table() -> tuple[dict, dict]:
    """(name -> (spec, note), name -> reason) from names.yaml; names stored in their normal form too."""
    try:
        data = yaml.safe_load(NAMES_FILE.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"{NAMES_FILE}: not readable ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict) or not isinstance(data.get("specs"), dict):
        raise ValueError(f"{NAMES_FILE}: expected a mapping with a 'specs' section")
    known, unsupported = {}, {}
    for spec, entry in data["specs"].items():
        if not (MODELS_DIR / f"{spec}.json").is_file():
            raise ValueError(f"{NAMES_FILE}: spec {spec!r} has no sim/models/{spec}.json")
        for name in entry.get("names") or []:
            for key in (str(name).lower(), normal_form(name)):
                known.setdefault(key, (spec, entry.get("note", "")))
    for entry in data.get("unsupported") or []:
        for name in entry.get("names") or []:
            unsupported[normal_form(name)] = str(entry.get("reason", "not modelled"))
    return known, unsupported


def resolve_name(label: str) -> Resolution:
    """The shipped spec a model label names (see names.yaml's rules); spec None with the reason otherwise."""
    text = str(label).strip()
    shipped = set(list_models())
    known, unsupported = _table()
    if text.lower() in shipped:
        return Resolution(text, text.lower(), "shipped spec")
    if text.lower() in known:
        spec, note = known[text.lower()]
        return Resolution(text, spec, note or "listed name")
    key = normal_form(text)
    if key in shipped:
        return Resolution(text, key, f"normal form {key!r} is a shipped spec")
    if key in known:
        spec, note = known[key]
        return Resolution(text, spec, f"normal form {key!r}" + (f": {note}" if note else ""))
    # an unsupported family matches with any suffix ("deepseek-v3-0324")
    hit = next((name for name in unsupported if key == name or key.startswith(name + "-")), None)
    if hit is not None:
        return Resolution(text, None, f"{text!r} is {unsupported[hit]}")
    return Resolution(text, None, f"no shipped spec for {text!r} (normal form {key!r}; shipped: "
                                  f"{', '.join(list_models())}; names: sim/models/names.yaml, or give a path to a "
                                  "config.json)")
