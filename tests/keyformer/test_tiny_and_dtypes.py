"""keyformer.tiny (the one random-model factory), keyformer.dtypes (the one torch dtype table), and
keyformer.compat as a leaf."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from keyformer.dtypes import TORCH_DTYPES, torch_dtype
from keyformer.tiny import TINY_SHAPES, random_model, tiny_config

KEYFORMER = Path(__file__).resolve().parents[2] / "keyformer"


def test_dtype_table():
    assert torch_dtype("bf16") is torch.bfloat16 and torch_dtype("float16") is torch.float16
    assert set(TORCH_DTYPES) == {"fp32", "bf16", "fp16"}
    with pytest.raises(ValueError, match="not supported for capture"):
        torch_dtype("int4", "capture")


@pytest.mark.parametrize("arch", sorted(TINY_SHAPES))
def test_every_tiny_shape_builds_seeded(arch):
    config = tiny_config(arch, vocab_size=64, positions=128)
    a, b = (random_model(config, seed=3, attn=None if arch == "mpt" else "eager") for _ in range(2))
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert a.config.vocab_size == 64 and not a.training


def test_random_model_dtype_and_bad_config():
    model = random_model(tiny_config("llama", 64, 128), dtype="bf16")
    assert next(model.parameters()).dtype is torch.bfloat16
    with pytest.raises(ValueError, match="unknown tiny architecture"):
        tiny_config("rwkv", 64, 128)


def test_compat_is_a_leaf():
    tree = ast.parse((KEYFORMER / "compat.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | \
               {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not [m for m in imported if m and m.split(".")[0] == "keyformer"], imported
