"""The one table from kvsim's dtype names to torch dtypes (the models run in these three)."""
from __future__ import annotations

import torch

from kvcommon.dtypes import dtype_name

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
TORCH_DTYPE_NAMES = tuple(TORCH_DTYPES)


def torch_dtype(name: str, what: str = "torch models") -> torch.dtype:
    """fp32 / bf16 / fp16 (or an alias: float16, torch.bfloat16, ...) as a torch dtype; ValueError otherwise."""
    key = dtype_name(name)
    if key not in TORCH_DTYPES:
        raise ValueError(f"dtype {name!r} not supported for {what} (choose from {', '.join(TORCH_DTYPE_NAMES)})")
    return TORCH_DTYPES[key]
