"""Sharding a model over tensor-parallel ranks and pipeline stages (see sim/parallel/__init__.py)."""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from sim.models import ModelSpec, load_model

ONCE_PER_STEP_OPS = ("embed", "final_norm", "lm_head")   # the core ops that are not per layer

def check_degrees(tp: int, pp: int) -> None:
    for name, value in (("tp", tp), ("pp", pp)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def kv_heads_per_rank(n_kv_heads: int, tp: int) -> int:
    """KV heads each TP rank stores: n_kv/tp, or 1 (replicated) when there are fewer KV heads than ranks."""
    if tp <= n_kv_heads:
        if n_kv_heads % tp:
            raise ValueError(f"tp={tp} does not divide the model's {n_kv_heads} KV heads")
        return n_kv_heads // tp
    if tp % n_kv_heads:
        raise ValueError(f"tp={tp} is not a multiple of the model's {n_kv_heads} KV heads (needed to replicate them)")
    return 1


def kv_replication(n_kv_heads: int, tp: int) -> float:
    """How many copies of each KV head the TP group stores (1: no replication)."""
    return kv_heads_per_rank(n_kv_heads, tp) * tp / n_kv_heads


def stage_layers(n_layers: int, pp: int) -> list[range]:
    """Contiguous layer runs of the pp stages; the first n_layers % pp stages take one layer more."""
    if pp > n_layers:
        raise ValueError(f"pp={pp} exceeds the model's {n_layers} layers")
    base, extra = divmod(n_layers, pp)
    out, start = [], 0
    for s in range(pp):
        size = base + (1 if s < extra else 0)
        out.append(range(start, start + size))
        start += size
    return out


def largest_stage(model: ModelSpec, pp: int) -> range:
    """The stage whose device is modelled: the most layers, then the most full-attention (unwindowed) layers."""
    sliding = set(model.sliding_layers) if model.sliding_window else set()
    return max(stage_layers(model.n_layers, pp), key=lambda r: (len(r), -sum(i in sliding for i in r)))


def shard_model(model, tp: int = 1, pp: int = 1) -> ModelSpec:
    """The part of the model one device holds (the largest stage of one TP rank), as a ModelSpec the
    single-device engine times and sizes unchanged. tp = pp = 1: the model itself."""
    model = load_model(model)
    check_degrees(tp, pp)
    if tp == 1 and pp == 1:
        return model
    if model.n_heads % tp:
        raise ValueError(f"tp={tp} does not divide the model's {model.n_heads} attention heads")
    kv = kv_heads_per_rank(model.n_kv_heads, tp)
    layers = largest_stage(model, pp)
    sliding = tuple(i - layers.start for i in model.sliding_layers if i in layers)
    return replace(model, name=f"{model.name}[tp{tp}pp{pp}]", n_layers=len(layers), n_heads=model.n_heads // tp,
                   n_kv_heads=kv, d_ff=math.ceil(model.d_ff / tp), vocab_size=math.ceil(model.vocab_size / tp),
                   # pp > 1: a stage holds the embedding or the LM head, not both (tied: one matrix)
                   tied_embeddings=model.tied_embeddings or pp > 1,
                   sliding_layers=sliding, sliding_window=model.sliding_window if sliding else None)


