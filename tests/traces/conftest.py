"""Shared fixtures: one tiny end-to-end capture (random 2-layer Llama, a local JSONL dataset) per session."""
from __future__ import annotations

import json

import pytest

TEXTS = [
    "The quick brown fox jumps over the lazy dog near the river bank while the sun sets slowly.",
    "A small robot learned to paint pictures of cats, dogs and birds in a quiet studio by the sea.",
]
RATIOS = (0.25, 0.5, 1.0)
POLICIES = ["full", "window", "streaming", "h2o", "keyformer", "keyformer:noise=none"]
MAX_NEW = 5


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "tiny.jsonl"
    with path.open("w") as fh:
        for i, text in enumerate(TEXTS):
            fh.write(json.dumps({"id": f"s{i}", "text": text[:60], "reference": text[60:]}) + "\n")
    return path


def tiny_config(out, dataset, **overrides):
    from traces.capture import CaptureConfig

    params = {"model": "tiny-llama", "policies": POLICIES, "dataset": f"jsonl:{dataset}", "out": out, "n": 2,
                  "max_new_tokens": MAX_NEW, "cache_ratios": RATIOS, "max_prompt_tokens": 48, "progress": False, "threads": 1}
    params.update(overrides)
    return CaptureConfig(**params)


@pytest.fixture(scope="session")
def tiny_trace_dir(tmp_path_factory, tiny_dataset):
    pytest.importorskip("torch")
    from traces.capture import run_capture

    out = tmp_path_factory.mktemp("trace") / "tiny"
    run_capture(tiny_config(out, tiny_dataset))
    return out
