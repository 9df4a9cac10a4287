"""Keyformer (Adnan et al., MLSys 2024, §3.3): key tokens ranked by a Gumbel-regularised softmax of the
attention logits, softmax((x + ζ)/τ), accumulated over the prompt (column sums of the causal score matrix)
and every decode step; τ rises linearly from tau_init to tau_end over the T generated tokens. The noisy
score only ranks tokens: the model's output uses its ordinary softmax (attention.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from keyformer.base import Policy

NOISES = ("gumbel", "gaussian", "constant", "none")
# The ablation's (paper §4.4.3, Table 4) moments of the standard Gumbel: Euler's gamma and pi/sqrt(6).
GUMBEL_MEAN = 0.5772
GUMBEL_STD = 1.2825


@dataclass
class KeyformerPolicy(Policy):
    noise: str = "gumbel"
    tau_init: float = 1.0
    tau_end: float = 2.0
    max_new_tokens: int | None = None  # T of the temperature schedule; generate() fills it in when unset
    seed: int = 0
    name: ClassVar[str] = "keyformer"
    needs_scores: ClassVar[bool] = True
    # noise (about 4: uniform draw, two logs) + add + divide by tau + softmax (max, subtract, exp, sum,
    # divide: 5) + accumulate
    score_flops_per_element: ClassVar[int] = 12

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.noise not in NOISES:
            raise ValueError(f"noise must be one of {', '.join(NOISES)}, got {self.noise!r}")
        if self.tau_init <= 0 or self.tau_end <= 0:
            raise ValueError(f"temperatures must be > 0, got tau_init={self.tau_init}, tau_end={self.tau_end}")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        self._generator = None

    def begin_sequence(self) -> None:
        self._generator = None  # reseeded lazily on the logits' device: same seed, same kept tokens

    def temperature(self, t: int) -> float:
        """tau_t = tau_init + t (tau_end - tau_init) / T, t = 0 at the prompt, t = s + 1 at decode step s."""
        if t == 0 or self.tau_end == self.tau_init:
            return self.tau_init
        if self.max_new_tokens is None:
            raise ValueError("keyformer's temperature schedule needs max_new_tokens (T): pass it to "
                             "make_policy or to generate()/decode_n_tokens")
        return self.tau_init + t * (self.tau_end - self.tau_init) / self.max_new_tokens

    def _noise(self, like: torch.Tensor) -> torch.Tensor | float:
        if self.noise == "none":
            return 0.0
        if self.noise == "constant":
            return GUMBEL_MEAN
        if self._generator is None or self._generator.device != like.device:
            self._generator = torch.Generator(device=like.device).manual_seed(self.seed)
        if self.noise == "gaussian":
            return torch.randn(like.shape, generator=self._generator, device=like.device,
                               dtype=like.dtype).mul_(GUMBEL_STD).add_(GUMBEL_MEAN)
        uniform = torch.rand(like.shape, generator=self._generator, device=like.device, dtype=like.dtype)
        tiny = torch.finfo(like.dtype).tiny
        return uniform.clamp_(min=tiny, max=1.0 - 1e-7).log_().neg_().log_().neg_()  # -log(-log u)

    def score_increment(self, logits: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
        tau = self.temperature(self.step + 1)
        noisy = logits + self._noise(logits)
        if tau != 1.0:
            noisy = noisy / tau
        return torch.softmax(noisy, dim=-1)

    def priority(self, positions: torch.Tensor, scores: torch.Tensor | None) -> torch.Tensor:
        return scores
