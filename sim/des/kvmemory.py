"""KV-cache memory of one accelerator as a pool of fixed-size blocks (vLLM's PagedAttention layout).

A block holds `block_tokens` tokens of K and V for every layer and KV head of one request, so a request
holding t tokens (mean per KV head, see sim.des.scheduler) occupies ceil(t / block_tokens) blocks.
The pool only counts blocks: which physical block a token sits in does not change any step time.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class BlockPool:
    capacity_blocks: int
    block_tokens: int
    block_bytes: float        # bytes of one block (block_tokens x KV bytes per token, all layers)
    used_blocks: int = 0
    peak_blocks: int = 0

    def __post_init__(self):
        if self.block_tokens < 1:
            raise ValueError(f"--block-size must be >= 1 token, got {self.block_tokens}")
        if self.capacity_blocks < 1:
            raise ValueError(
                f"no room for the KV cache: capacity is {self.capacity_blocks} blocks of {self.block_tokens} tokens "
                "(the weights fill the device memory)")

    def blocks_for(self, tokens):
        """Blocks needed to hold `tokens` (scalar or array; fractional mean lengths round up)."""
        return np.ceil(np.asarray(tokens, dtype=float) / self.block_tokens - 1e-9).astype(np.int64)

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
