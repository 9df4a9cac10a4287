"""Keyformer (Adnan et al., MLSys 2024, §3.3): key tokens ranked by a Gumbel-regularised softmax of the
attention logits, softmax((x + ζ)/τ), accumulated over the prompt (column sums of the causal score matrix)
and every decode step; τ rises linearly from tau_init to tau_end over the T generated tokens. The noisy
score only ranks tokens: the model's output uses its ordinary softmax (attention.py)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from keyformer.base import SELECTIONS, Policy
from kvcommon.score_costs import SCORE_FLOPS_PER_ELEMENT

NOISES = ("gumbel", "gaussian", "constant", "none")
# The ablation's (paper §4.4.3, Table 4) moments of the standard Gumbel: Euler's gamma and pi/sqrt(6).
GUMBEL_MEAN = 0.5772
GUMBEL_STD = 1.2825
# Uniform draws come as 23-bit integers v: u = (v + 1/2) / 2^23 lies strictly inside (0, 1) and both u and
# 1 - u = (2^23 - 1/2 - v) / 2^23 are exact in fp32 (at most 24 significant bits).
UNIFORM_BITS = 23
UNIFORM_TOP = float((1 << UNIFORM_BITS) - 0.5)  # 2^23 - 1/2, exact in fp32
UNIFORM_SCALE = 2.0 ** -UNIFORM_BITS
NOISE_POOL_MAX = 1 << 19  # elements (2 MiB of fp32): above this, noise is drawn per layer


@dataclass
class KeyformerPolicy(Policy):
    noise: str = "gumbel"
    tau_init: float = 1.0
    tau_end: float = 2.0
    max_new_tokens: int | None = None  # T of the temperature schedule; generate() fills it in when unset
    seed: int = 0
    # "paper": re-rank every step (the paper's text, Alg. 1). "official": the released code's semantics
    # (d-matrix-ai/keyformer-llm): key tokens chosen at the prompt, then frozen; the w newest tokens including
    # the incoming one, exactly k attended (see base.py and shared/docs/keyformer-paper.md §1.5).
    selection: str = "paper"
    name: ClassVar[str] = "keyformer"
    needs_scores: ClassVar[bool] = True
    score_flops_per_element: ClassVar[int] = SCORE_FLOPS_PER_ELEMENT["keyformer"]  # counted in kvcommon.score_costs

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.noise not in NOISES:
            raise ValueError(f"noise must be one of {', '.join(NOISES)}, got {self.noise!r}")
        if self.tau_init <= 0 or self.tau_end <= 0:
            raise ValueError(f"temperatures must be > 0, got tau_init={self.tau_init}, tau_end={self.tau_end}")
        if self.selection not in SELECTIONS:
            raise ValueError(f"selection must be one of {', '.join(SELECTIONS)}, got {self.selection!r}")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        self._generator = None
        self._pool, self._pool_step = None, None

    def begin_sequence(self) -> None:
        self._generator = None  # reseeded lazily on the logits' device: same seed, same kept tokens
        self._pool, self._pool_step = None, None

    def rng_state(self):
        if self._generator is None:
            return None
        return (self._generator.device, self._generator.get_state())

    def set_rng_state(self, state) -> None:
        if state is not None:
            device, value = state
            self._generator = torch.Generator(device=device)
            self._generator.set_state(value)

    def temperature(self, t: int) -> float:
        """tau_t = tau_init + t (tau_end - tau_init) / T, t = 0 at the prompt, t = s + 1 at decode step s."""
        if t == 0 or self.tau_end == self.tau_init:
            return self.tau_init
        if self.max_new_tokens is None:
            raise ValueError("keyformer's temperature schedule needs max_new_tokens (T): pass it to "
                             "make_policy or to generate()/decode_n_tokens")
        return self.tau_init + t * (self.tau_end - self.tau_init) / self.max_new_tokens

    def score_increment(self, logits: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
        tau = self.temperature(self.step + 1)
        if self.noise == "none":
            return torch.softmax(logits if tau == 1.0 else logits / tau, dim=-1)
        # (x + zeta) / tau in one pass: zeta / tau comes precomputed with the noise.
        return torch.softmax(torch.add(self._noise_over_tau(logits, tau), logits, alpha=1.0 / tau), dim=-1)

    def _noise_over_tau(self, like: torch.Tensor, tau: float) -> torch.Tensor:
        """zeta / tau shaped like the logits of the current layer.

        Small decode steps draw the noise of all layers at once at the step's first layer (one generator call
        and one transform per step instead of per layer: per-call overhead dominates there). Large ones and
        the prompt draw layer by layer, so the transform's passes stay in cache."""
        if self._generator is None or self._generator.device != like.device:
            self._generator = torch.Generator(device=like.device).manual_seed(self.seed)
        if like.shape[3] > 1 and getattr(self, "prompt_groups", None) is not None:
            # The beams of one input see the same prompt noise, so they start from the same key set.
            unique = torch.unique(self.prompt_groups)
            drawn = self._draw((len(unique),) + tuple(like.shape[1:]), like, tau)
            slot = torch.empty(len(self.prompt_groups), dtype=torch.long, device=unique.device)
            slot[unique] = torch.arange(len(unique), device=unique.device)
            return drawn.index_select(0, slot[self.prompt_groups].to(drawn.device))
        if like.shape[3] > 1 or like.numel() * len(self.layers) > NOISE_POOL_MAX:
            return self._draw(like.shape, like, tau)
        if self._pool_step != self.step or self._pool.shape[1:] != like.shape:
            self._pool = self._draw((len(self.layers),) + tuple(like.shape), like, tau)
            self._pool_step = self.step
        return self._pool[self._active_layer]

    def _draw(self, shape, like: torch.Tensor, tau: float) -> torch.Tensor:
        count = math.prod(shape)
        if self.noise == "constant":
            return torch.full(shape, GUMBEL_MEAN / tau, device=like.device, dtype=like.dtype)
        if self.noise == "gaussian":
            noise = torch.randn(count, generator=self._generator, device=like.device, dtype=like.dtype)
            return noise.mul_(GUMBEL_STD / tau).add_(GUMBEL_MEAN / tau).view(shape)
        # Gumbel(0, 1) = -log(E), E = -log u ~ Exp(1). E is computed as -log1p(-(1 - u)) from the exact
        # 1 - u, so it is never 0 (u = 1 - 2^-24 gives E = 6e-8, not a cancellation to 0) and never inf: the
        # draws span about [-2.8, 16.6], all finite. Drawn in fp32 whatever the logits' dtype (2^23 overflows
        # fp16), then cast.
        exponential = self._one_minus_uniform(count, like.device).mul_(-1.0).log1p_().mul_(-1.0)
        return exponential.log_().mul_(-1.0 / tau).view(shape).to(like.dtype)

    def _one_minus_uniform(self, count: int, device) -> torch.Tensor:
        """1 - u for u uniform on the 2^23 midpoints (v + 1/2) / 2^23, v = 0 .. 2^23 - 1: strictly inside (0, 1).

        The bits come at about half torch.rand's cost on CPU: each 64-bit draw of the generator (uniform on
        [0, 2^63)) gives two 32-bit halves, whose low 23 bits are independent and uniform."""
        bits = torch.empty((count + 1) // 2, dtype=torch.int64, device=device).random_(generator=self._generator)
        v = (bits.view(torch.int32)[:count] & ((1 << UNIFORM_BITS) - 1)).to(torch.float32)
        return torch.sub(UNIFORM_TOP, v).mul_(UNIFORM_SCALE)

    def priority(self, positions: torch.Tensor, scores: torch.Tensor | None) -> torch.Tensor:
        return scores
