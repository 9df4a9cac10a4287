"""The bookkeeping every policy shares, apart from selection itself: the events observers receive, the
score work counted per step, and the tensor helpers of ranking and scoring (top by rank, the rows of a batch
that are one prompt, the finiteness check, the reduction of a score increment over queries and a GQA group).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class StepEvent:
    """Sent to observers after each layer's eviction (or compaction after the prompt)."""
    step: int  # -1 = prefill, s >= 0 = decode step s
    layer: int
    kept_positions: torch.Tensor  # (batch, n_kv_heads, k) original positions, -1 = empty
    kv_len: int  # tokens held per KV head (max over the batch)


@dataclass
class ScoreWork:
    """Work done by the score function (noise, softmax, accumulation) and the selection, per step.

    `elements` counts score-matrix entries processed (batch x query heads x queries x keys, summed over
    layers); `flops` multiplies them by the policy's per-element cost (see each policy's
    `score_flops_per_element`); `select_elements` counts the priorities ranked by top-k / argmin.
    """
    elements: int = 0
    flops: int = 0
    select_elements: int = 0
    by_step: dict = field(default_factory=dict)  # step -> {"elements", "flops", "select_elements"}

    def add(self, step: int, elements: int, flops: int, select_elements: int) -> None:
        self.elements += elements
        self.flops += flops
        self.select_elements += select_elements
        row = self.by_step.setdefault(step, {"elements": 0, "flops": 0, "select_elements": 0})
        row["elements"] += elements
        row["flops"] += flops
        row["select_elements"] += select_elements

    def reset(self) -> None:
        self.elements = self.flops = self.select_elements = 0
        self.by_step = {}


def top_by_rank(ranking: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """Bool mask of the `count` highest entries of `ranking` along the last axis (entries at -inf never),
    `count` broadcasting against ranking.shape[:-1]; ties broken by slot order."""
    order = ranking.sort(dim=-1, descending=True, stable=True)
    rank = torch.arange(ranking.shape[-1], device=ranking.device)
    take = (rank < count.unsqueeze(-1)) & (order.values > -math.inf)
    return torch.zeros_like(take).scatter_(-1, order.indices, take)


def identical_rows(inputs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor | None:
    """(B,) index of the first row equal to each row (same inputs and mask); None when all rows differ."""
    batch = inputs.shape[0]
    if batch == 1:
        return None
    rows = torch.cat([inputs.reshape(batch, -1).float(), mask.reshape(batch, -1).float()], dim=1)
    same = (rows.unsqueeze(1) == rows.unsqueeze(0)).all(-1)  # (B, B)
    first = same.float().argmax(dim=1)  # the lowest index equal to each row
    if bool((first == torch.arange(batch, device=first.device)).all()):
        return None
    return first


def check_finite(increment: torch.Tensor, policy, layer_idx: int) -> None:
    """A NaN or inf score would rank first in top-k and make selection arbitrary (the recent window could be
    dropped silently): refuse it. One reduction over (B, H_kv, S) per layer."""
    if not bool(torch.isfinite(increment).all()):
        bad = int((~torch.isfinite(increment)).sum())
        raise FloatingPointError(f"{policy.name}: {bad} non-finite score(s) at layer {layer_idx}, step {policy.step}"
                                 " (the model's attention logits or the policy's noise overflowed)")


def reduce_queries(increment: torch.Tensor, gqa_reduce: str) -> torch.Tensor:
    """(B, H_kv, G, q, S) -> (B, H_kv, S): column sums over the queries, sum or mean over the group."""
    batch, kv_heads, group, q_len, slots = increment.shape
    if q_len > 1:
        increment = increment.sum(dim=3, keepdim=True)
    if group > 1:
        increment = increment.sum(dim=2, keepdim=True) if gqa_reduce == "sum" else increment.mean(dim=2, keepdim=True)
    return increment.view(batch, kv_heads, slots)
