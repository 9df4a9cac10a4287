"""KV-cache memory of one accelerator as a pool of fixed-size blocks (vLLM's PagedAttention layout).

A block holds `block_tokens` tokens of K and V for every layer and KV head of one request, so a request
holding t tokens (mean per KV head, see sim.des.scheduler) occupies ceil(t / block_tokens) blocks.
The pool only counts blocks: which physical block a token sits in does not change any step time.
`kv_schedule_table` lays out what each request holds per decode step, and its peak, for the scheduler;
`prefill_held` says what a prefill leaves held (its tokens, a sliding window's worth at most).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np

if TYPE_CHECKING:
    from .step_plan import KVLengths


@dataclass
class BlockPool:
    capacity_blocks: int
    block_tokens: int
    block_bytes: float        # bytes of one block (block_tokens x KV bytes per token, all layers)
    used_blocks: int = 0
    peak_blocks: int = 0

    def __post_init__(self):
        if self.block_tokens < 1:
            raise ValueError(f"block_tokens must be >= 1 token, got {self.block_tokens}")
        if self.capacity_blocks < 1:
            raise ValueError(
                f"no room for the KV cache: capacity is {self.capacity_blocks} blocks of {self.block_tokens} tokens "
                "(the weights fill the device memory)")

    def blocks_for(self, tokens):
        """Blocks needed to hold `tokens` (scalar or array; fractional mean lengths round up)."""
        return np.ceil(np.asarray(tokens, dtype=float) / self.block_tokens - 1e-9).astype(np.int64)

    def blocks_for_one(self, tokens) -> int:
        """blocks_for of one length: the same float arithmetic without numpy's per-call cost (admission
        asks it for every request it looks at)."""
        return math.ceil(float(tokens) / self.block_tokens - 1e-9)

    @property
    def free_blocks(self) -> int:
        return self.capacity_blocks - self.used_blocks

    def allocate(self, blocks: int) -> None:
        if blocks < 0:
            raise AssertionError("negative allocation")
        if self.used_blocks + blocks > self.capacity_blocks:
            # The scheduler checks before allocating; reaching this is a scheduler bug, not a user error.
            raise AssertionError(f"KV pool over capacity: {self.used_blocks} + {blocks} > {self.capacity_blocks}")
        self.used_blocks += int(blocks)
        self.peak_blocks = max(self.peak_blocks, self.used_blocks)

    def release(self, blocks: int) -> None:
        if blocks < 0 or blocks > self.used_blocks:
            raise AssertionError(f"bad release of {blocks} blocks with {self.used_blocks} in use")
        self.used_blocks -= int(blocks)

    @property
    def used_bytes(self) -> float:
        return self.used_blocks * self.block_bytes

    @property
    def capacity_bytes(self) -> float:
        return self.capacity_blocks * self.block_bytes


def prefill_held(kv) -> Callable:
    """tokens computed by a prefill -> tokens per KV head it leaves held: the KV source's `prompt_kv` (a
    sliding-window layer keeps at most its window, sim.kvlen.windowed), or all of them for a source
    without one."""
    held = getattr(kv, "prompt_kv", None)
    return held if held is not None else (lambda tokens: tokens)


def kv_schedule_table(kv: KVLengths, prompt: np.ndarray, output: np.ndarray,
                      pool: BlockPool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All distinct per-request KV schedules in one flat float array, each request's offset in it, and
    each request's peak need in blocks (max over its prefill, which holds its prompt or a sliding window's
    worth of it, and its decode steps, +1 for the appended token)."""
    n = len(prompt)
    pieces, offsets, seen = [], np.zeros(n, dtype=np.int64), {}
    peak_tokens = np.zeros(n)
    total = 0
    held_after_prefill = prefill_held(kv)
    for i in range(n):
        p, gen = int(prompt[i]), int(output[i])
        sched = np.asarray(kv.decode_kv(i, p, gen), dtype=float)
        if sched.ndim != 1 or len(sched) < gen - 1:
            raise ValueError(f"kv schedule of request {i} has shape {sched.shape}; needs >= {gen - 1} decode steps")
        key = id(sched)
        if key not in seen:
            seen[key] = (total, sched)  # keep a reference so id() stays unique
            pieces.append(sched)
            total += len(sched)
        offsets[i] = seen[key][0]
        steps = sched[:gen - 1]
        peak_tokens[i] = max(float(held_after_prefill(p)), steps.max() + 1.0 if len(steps) else 0.0)
    # one padding slot so that a request with G = 1 indexes a valid (unused) entry
    flat = np.concatenate(pieces + [np.zeros(1)]) if pieces else np.zeros(1)
    return flat, offsets, pool.blocks_for(peak_tokens)
