"""What the scheduler is configured with (`SchedulerConfig`), what it reads (`KVLengths`) and what it
decides for one forward pass (`StepPlan`); sim.des.scheduler holds the bookkeeping that fills them."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

ADMISSION_MODES = ("paged", "reserve")
DEFAULT_WATERMARK = 0.01  # vLLM's default fraction of blocks kept free when admitting new prefills


class KVLengths(Protocol):
    def decode_kv(self, request: int, prompt: int, gen: int) -> np.ndarray:
        """Cached tokens per KV head (mean over layers) read by decode steps 0.. of this request, before
        the step appends its own token (sim.kvlen.kv_tokens convention); length >= gen - 1."""


@dataclass(frozen=True)
class SchedulerConfig:
    block_tokens: int = 16
    capacity_blocks: int = 1
    block_bytes: float = 1.0
    max_batch: int | None = None           # vLLM max_num_seqs: requests in flight (prefilling + decoding)
    chunked_prefill: int | None = None     # token budget per step (decodes count 1 each); None = whole prompts
    max_step_tokens: int | None = None     # without chunking: prefill tokens per step (vLLM max_num_batched_tokens);
                                           # one prompt longer than this still runs alone
    admission: str = "paged"
    watermark: float = DEFAULT_WATERMARK

    def __post_init__(self):
        if self.admission not in ADMISSION_MODES:
            raise ValueError(f"unknown admission mode {self.admission!r}; expected one of {', '.join(ADMISSION_MODES)}")
        if self.max_batch is not None and self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {self.max_batch}")
        if self.chunked_prefill is not None and self.chunked_prefill < 1:
            raise ValueError(f"chunked_prefill must be >= 1 token, got {self.chunked_prefill}")
        if self.max_step_tokens is not None and self.max_step_tokens < 1:
            raise ValueError(f"max_step_tokens must be >= 1, got {self.max_step_tokens}")
        if not (0.0 <= self.watermark < 1.0):
            raise ValueError(f"watermark must be in [0, 1), got {self.watermark}")


@dataclass
class StepPlan:
    """One forward pass: decode requests (one token each) and prefill chunks
    (request, new_tokens, past_tokens, completes_prompt)."""

    decode_ids: np.ndarray
    decode_kv: np.ndarray                  # cached tokens per KV head each decode request reads
    prefill: list[tuple[int, int, int, bool]] = field(default_factory=list)

    @property
    def batch_size(self) -> int:
        return len(self.decode_ids) + len(self.prefill)

    @property
    def prefill_tokens(self) -> int:
        return sum(chunk[1] for chunk in self.prefill)

    @property
    def prefill_chunks(self) -> list[tuple[int, int, bool]]:
        """(new_tokens, past_tokens, completes_prompt) as sim.engine.prefill_time takes them."""
        return [(new, past, completes) for _, new, past, completes in self.prefill]
