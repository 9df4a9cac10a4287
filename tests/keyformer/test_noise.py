"""Keyformer's noise sampler: exact in fp32 at the extreme uniform values, finite over tens of millions of
draws, and a guard that refuses non-finite scores instead of ranking them."""
from __future__ import annotations

import math

import pytest
import torch

from keyformer import make_policy
from keyformer.generate import decode_n_tokens, prefill
from keyformer.keyformer import UNIFORM_BITS
from tests.keyformer.tiny_models import VOCAB, build


def _gumbel_from_bits(policy, v: torch.Tensor) -> torch.Tensor:
    """The sampler's transform applied to chosen 23-bit integers v (instead of random ones)."""
    generator = torch.Generator().manual_seed(0)
    original = torch.Tensor.random_
    pairs = torch.zeros(2 * ((len(v) + 1) // 2), dtype=torch.int32)
    pairs[: len(v)] = v.to(torch.int32)

    def fixed_random_(self, *args, **kwargs):  # the int64 draws whose int32 halves are exactly v
        self.copy_(pairs.view(torch.int64))
        return self
    torch.Tensor.random_ = fixed_random_
    try:
        return policy._draw((len(v),), torch.zeros(1), tau=1.0, generator=generator)
    finally:
        torch.Tensor.random_ = original


def test_extreme_uniform_values_give_finite_exact_gumbels():
    policy = make_policy("keyformer", max_new_tokens=4)
    top = (1 << UNIFORM_BITS) - 1
    v = torch.tensor([0, 1, 2, top // 2, top - 15, top - 1, top])
    zeta = _gumbel_from_bits(policy, v)
    assert bool(torch.isfinite(zeta).all())
    u = (v.double() + 0.5) / 2 ** UNIFORM_BITS  # the float64 truth: -log(-log u)
    exact = -torch.log(-torch.log(u))
    assert torch.allclose(zeta.double(), exact, rtol=1e-6, atol=1e-6)
    # the largest draws are distinct (the old 24 ln 2 - log v form cancelled to +inf for the top 15 values)
    assert len(set(zeta[-3:].tolist())) == 3 and zeta.max().item() == pytest.approx(-math.log(-math.log1p(-2.0 ** -24)), rel=1e-6)


def test_the_old_cancellation_is_what_the_new_sampler_avoids():
    """24 ln 2 - log v in fp32 is exactly 0 for the top values of v: -log of it is +inf."""
    v = torch.tensor([float((1 << 24) - 1)], dtype=torch.float32)
    assert float(torch.sub(24 * math.log(2.0), v.log())) == 0.0


@pytest.mark.parametrize("noise", ["gumbel", "gaussian", "constant"])
def test_noise_follows_the_logits_dtype_and_is_finite(noise):
    policy = make_policy("keyformer", noise=noise, max_new_tokens=4)
    generator = torch.Generator().manual_seed(1)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        zeta = policy._draw((200_000,), torch.zeros(1, dtype=dtype), tau=1.0, generator=generator)
        assert zeta.dtype == dtype and bool(torch.isfinite(zeta).all())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_keyformer_on_half_precision_models_keeps_its_recent_window(dtype):
    model = build("llama_gqa").to(dtype)
    ids = torch.randint(3, VOCAB, (2, 40), generator=torch.Generator().manual_seed(5))
    policy = make_policy("keyformer", cache_ratio=0.5, recent_ratio=0.3, max_new_tokens=6)
    with prefill(model, policy, ids) as state:
        decode_n_tokens(state, 5)
        held = policy.kept_positions(0)
        newest = int(held.max())
        recent = int(policy.recent[0])
        for b in range(2):
            for h in range(held.shape[1]):
                assert set(range(newest - recent + 1, newest + 1)) <= set(held[b, h].tolist())
    assert bool(torch.isfinite(policy.layers[0].scores).all())


def test_non_finite_scores_raise_instead_of_ranking():
    model = build("llama_gqa")
    policy = make_policy("h2o", cache_ratio=0.5)
    original = type(policy).score_increment

    def poisoned(self, logits, probs):
        out = probs.clone()
        out[..., 0] = float("nan")
        return out
    type(policy).score_increment = poisoned
    try:
        with pytest.raises(FloatingPointError, match="non-finite score"):
            with prefill(model, policy, torch.randint(3, VOCAB, (1, 24))):
                pass
    finally:
        type(policy).score_increment = original


def _draw_count_nonfinite(total: int, chunk: int = 1 << 22) -> tuple[int, float, float]:
    policy = make_policy("keyformer", max_new_tokens=4)
    generator = torch.Generator().manual_seed(12345)
    bad, top, low = 0, -math.inf, math.inf
    done = 0
    while done < total:
        zeta = policy._draw((min(chunk, total - done),), torch.zeros(1), tau=1.0, generator=generator)
        bad += int((~torch.isfinite(zeta)).sum())
        top, low = max(top, zeta.max().item()), min(low, zeta.min().item())
        done += zeta.numel()
    return bad, top, low


def test_a_million_draws_are_finite():
    bad, top, low = _draw_count_nonfinite(1 << 20)
    assert bad == 0 and top < 17.0 and low > -3.0


@pytest.mark.slow
def test_forty_million_draws_are_finite():
    """The old sampler gave 37 non-finite values in 40M draws (about 9e-7 per element)."""
    bad, top, low = _draw_count_nonfinite(40_000_000)
    assert bad == 0
    assert 14.0 < top < 16.7 and -2.9 < low  # the Gumbel's tail is reached but bounded by the 23-bit grid
