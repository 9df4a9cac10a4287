"""Keyformer (Adnan et al., MLSys 2024, §3.3): key tokens ranked by a Gumbel-regularised softmax of the
attention logits, softmax((x + ζ)/τ), accumulated over the prompt (column sums of the causal score matrix)
and every decode step; τ rises linearly from tau_init to tau_end over the T generated tokens. The noisy
score only ranks tokens: the model's output uses its ordinary softmax (attention.py)."""
from __future__ import annotations

import hashlib
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


BEAM_NOISES = ("shared", "summed")


def stream_seed(seed: int, sample: int, replica: int) -> int:
    """The generator seed of one sequence: its run's `seed`, its sample index and its replica (the beams of
    one input are replicas 0, 1, ...). A hash, so neighbouring seeds and samples get unrelated streams."""
    digest = hashlib.blake2b(f"keyformer/{seed}/{sample}/{replica}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1  # torch seeds are below 2^63


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
    # Rows of a batch that are one prompt (the beams transformers expands from one input): "shared" = one
    # prompt-noise draw for all of them; "summed" = each row draws its own and they rank by the sum of the
    # draws' scores (the released code sums its Gumbel scores over the batch dimension, so its 4 beams make
    # a 4-draw prompt score). Kept as the group's mean, which ranks the same and keeps the decode steps'
    # per-row increments on the same scale.
    beam_noise: str = "shared"
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
        if self.beam_noise not in BEAM_NOISES:
            raise ValueError(f"beam_noise must be one of {', '.join(BEAM_NOISES)}, got {self.beam_noise!r}")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        self.sample_indices: list[int] | None = None  # set by the caller before a prefill (traces.capture)
        self._samples_seen = 0  # prompts prefilled so far by this policy (the default sample index)
        self._streams: list[tuple[int, int]] = []  # per batch row: (sample index, replica)
        self._generators: list = []
        self._pool, self._pool_step = None, None

    def begin_sequence(self) -> None:
        """Seed one noise stream per row: (seed, sample index, replica), so a sample's noise depends neither
        on the batch it runs in nor on the samples before it. The sample index is `sample_indices[group]` when
        the caller set it (one per distinct prompt or one per row; consumed by this prefill), else the count of
        prompts this policy has prefilled before."""
        batch = len(self.prompt_lengths)
        groups = self.prompt_groups.tolist() if self.prompt_groups is not None else list(range(batch))
        firsts = list(dict.fromkeys(groups))  # one entry per distinct prompt, in row order
        indices = self.sample_indices
        if indices is None:
            indices = list(range(self._samples_seen, self._samples_seen + len(firsts)))
        if len(indices) == len(firsts):
            by_group = dict(zip(firsts, indices))
            indices = [by_group[group] for group in groups]
        elif len(indices) != batch:
            raise ValueError(f"sample_indices gives {len(indices)} index(es) for a batch of {batch} row(s) "
                             f"({len(firsts)} distinct prompt(s))")
        self.sample_indices = None
        self._samples_seen += len(firsts)
        replicas: dict[int, int] = {}
        self._streams = []
        for index in indices:  # rows of one sample (its beams) are its replicas 0, 1, ...
            self._streams.append((int(index), replicas.get(index, 0)))
            replicas[index] = replicas.get(index, 0) + 1
        self._generators = []  # created lazily on the logits' device
        self._pool, self._pool_step = None, None

    def prompt_score_key(self):
        return super().prompt_score_key() + (tuple(self._streams),)

    def rng_state(self):
        if not self._generators:
            return None
        return [(g.device, g.get_state()) for g in self._generators]

    def set_rng_state(self, state) -> None:
        if state is not None:
            self._generators = []
            for device, value in state:
                generator = torch.Generator(device=device)
                generator.set_state(value)
                self._generators.append(generator)

    def finalize_prompt_scores(self, scores: torch.Tensor) -> torch.Tensor:
        """beam_noise="summed": every row of one prompt ranks by its group's mean score (= the sum's ranking)."""
        groups = getattr(self, "prompt_groups", None)
        if self.beam_noise != "summed" or groups is None:
            return scores
        groups = groups.to(scores.device)
        total = torch.zeros_like(scores).index_add_(0, groups, scores)
        count = torch.zeros(scores.shape[0], device=scores.device, dtype=scores.dtype).index_add_(
            0, groups, torch.ones(scores.shape[0], device=scores.device, dtype=scores.dtype))
        return (total / count.clamp(min=1).view(-1, 1, 1)).index_select(0, groups)

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
        """zeta / tau shaped like the logits of the current layer, each batch row from its own stream and over
        its own extent only (its unpadded prompt; at decode the hold + 1 slots its sequence uses), so a sample's
        draws are the same whatever batch it runs in; the rest (padding, masked anyway) is 0.

        Small decode steps draw the noise of all layers at once at the step's first layer (one generator call
        and one transform per row and step instead of per layer: per-call overhead dominates there). Large ones
        and the prompt draw layer by layer, so the transform's passes stay in cache."""
        if not self._generators or self._generators[0].device != like.device:
            self._generators = [torch.Generator(device=like.device).manual_seed(stream_seed(self.seed, *stream))
                                for stream in self._streams]
        head_shape = tuple(like.shape[1:3])
        if like.shape[3] > 1:  # the prompt
            rows = list(range(like.shape[0]))
            groups = getattr(self, "prompt_groups", None)
            if groups is not None and self.beam_noise == "shared":
                rows = groups.tolist()  # the beams of one input see their first row's draw
            lengths = self.prompt_lengths.tolist()
            drawn = {row: self._draw(head_shape + (lengths[row], lengths[row]), like, tau, self._generators[row])
                     for row in dict.fromkeys(rows)}
            return self._place(like.shape, [drawn[row] for row in rows], like)
        slots = like.shape[-1]
        widths = [min(int(h) + 1, slots) for h in self.hold.tolist()]
        if like.numel() * len(self.layers) > NOISE_POOL_MAX:
            return self._place(like.shape, [self._draw(head_shape + (1, w), like, tau, g)
                                            for g, w in zip(self._generators, widths)], like)
        if self._pool_step != self.step or self._pool.shape[2:] != like.shape[1:]:
            layers = (len(self.layers),) + tuple(like.shape[1:])
            self._pool = self._place((like.shape[0],) + layers,
                                     [self._draw((len(self.layers),) + head_shape + (1, w), like, tau, g)
                                      for g, w in zip(self._generators, widths)], like)  # (B, L, ...)
            self._pool_step = self.step
        return self._pool[:, self._active_layer]

    @staticmethod
    def _place(shape, rows: list, like: torch.Tensor) -> torch.Tensor:
        """Rows of draws into a zero tensor of `shape`, each in the last entries of the last two axes (a
        left-padded prompt's real block; a decode step's first slots need no offset: its query axis is 1)."""
        if len(rows) == 1 and tuple(rows[0].shape) == tuple(shape[1:]):
            return rows[0].unsqueeze(0)  # no copy of a prompt-sized tensor
        out = torch.zeros(shape, device=like.device, dtype=like.dtype)
        for b, row in enumerate(rows):
            q, s = row.shape[-2:]
            if q == 1:
                out[b, ..., :, :s] = row
            else:
                out[b, ..., -q:, -s:] = row
        return out

    def _draw(self, shape, like: torch.Tensor, tau: float, generator: torch.Generator) -> torch.Tensor:
        count = math.prod(shape)
        if self.noise == "constant":
            return torch.full(shape, GUMBEL_MEAN / tau, device=like.device, dtype=like.dtype)
        if self.noise == "gaussian":
            noise = torch.randn(count, generator=generator, device=like.device, dtype=like.dtype)
            return noise.mul_(GUMBEL_STD / tau).add_(GUMBEL_MEAN / tau).view(shape)
        # Gumbel(0, 1) = -log(E), E = -log u ~ Exp(1). E is computed as -log1p(-(1 - u)) from the exact
        # 1 - u, so it is never 0 (u = 1 - 2^-24 gives E = 6e-8, not a cancellation to 0) and never inf: the
        # draws span about [-2.8, 16.6], all finite. Drawn in fp32 whatever the logits' dtype (2^23 overflows
        # fp16), then cast.
        exponential = self._one_minus_uniform(count, like.device, generator).mul_(-1.0).log1p_().mul_(-1.0)
        return exponential.log_().mul_(-1.0 / tau).view(shape).to(like.dtype)

    @staticmethod
    def _one_minus_uniform(count: int, device, generator: torch.Generator) -> torch.Tensor:
        """1 - u for u uniform on the 2^23 midpoints (v + 1/2) / 2^23, v = 0 .. 2^23 - 1: strictly inside (0, 1).

        The bits come at about half torch.rand's cost on CPU: each 64-bit draw of the generator (uniform on
        [0, 2^63)) gives two 32-bit halves, whose low 23 bits are independent and uniform."""
        bits = torch.empty((count + 1) // 2, dtype=torch.int64, device=device).random_(generator=generator)
        v = (bits.view(torch.int32)[:count] & ((1 << UNIFORM_BITS) - 1)).to(torch.float32)
        return torch.sub(UNIFORM_TOP, v).mul_(UNIFORM_SCALE)

    def priority(self, positions: torch.Tensor, scores: torch.Tensor | None) -> torch.Tensor:
        return scores
