"""Sliding-window layers in the simulator's KV accounting (issue 17): Mistral-7B v0.1's 4096-token window
caps what each layer holds (a 16k prompt no longer holds 16k tokens per layer); Qwen2 only with
use_sliding_window; per-layer `layer_types` give the mean over layers."""
from __future__ import annotations

import json

import numpy as np
import pytest

from sim import engine, kvlen
from sim.des.analytic import PolicyKV
from sim.models import MODELS_DIR, load_model, spec_from_config

HW = "a100-80g-sxm"


def mistral_v01(tmp_path, window=4096):
    cfg = json.loads((MODELS_DIR / "mistral-7b.json").read_text())
    cfg.update(sliding_window=window, vocab_size=32000, _source="Mistral-7B-v0.1 shape (test)")
    path = tmp_path / "mistral-v01" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(cfg))
    return load_model(path)


def test_mistral_window_is_read_for_every_layer(tmp_path):
    m = mistral_v01(tmp_path)
    assert m.sliding_window == 4096 and m.sliding_layers == tuple(range(32)) and m.windowed_layers == 32
    shipped = load_model("mistral-7b")                       # v0.3: "sliding_window": null
    assert shipped.sliding_window is None and shipped.windowed_layers == 0


def test_qwen2_window_only_with_use_sliding_window_and_layer_types_mix():
    base = dict(model_type="qwen2", hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, vocab_size=1000, max_position_embeddings=32768,
                sliding_window=1024, max_window_layers=2)
    assert spec_from_config({**base, "use_sliding_window": False}, "q").windowed_layers == 0
    assert spec_from_config({**base, "use_sliding_window": True}, "q").sliding_layers == (2, 3)
    mixed = spec_from_config({**base, "model_type": "llama", "layer_types": ["sliding_attention"] * 3 +
                              ["full_attention"]}, "g")
    assert mixed.sliding_layers == (0, 1, 2)
    # mean over layers: 3 of 4 layers hold at most 1024
    assert kvlen.kv_tokens("full", 4096, 0, 1.0, model=mixed) == pytest.approx((3 * 1024 + 4096) / 4)
    assert kvlen.kv_tokens("full", 512, 0, 1.0, model=mixed) == pytest.approx(512)   # inside the window
    # evicting policies: min(budget, window) on the windowed layers
    assert kvlen.kv_tokens("h2o", 8192, 0, 0.5, model=mixed) == pytest.approx((3 * 1024 + 4096) / 4)
    with pytest.raises(ValueError, match="layer_types lists 2 layers for 4"):
        spec_from_config({**base, "layer_types": ["full_attention"] * 2}, "bad")


def test_a_16k_prompt_holds_the_window_not_16k_tokens(tmp_path):
    windowed, plain = mistral_v01(tmp_path), load_model("mistral-7b")
    kw = dict(batch=1, prompt=16384, gen=64, policy="full", cache_ratio=1.0)
    w, p = engine.predict(HW, windowed, **kw), engine.predict(HW, plain, **kw)
    assert w.extra["peak_kv_tokens"] == pytest.approx(4096)
    assert p.extra["peak_kv_tokens"] == pytest.approx(16384 + 64)
    kv_w = w.decode_ops.loc[w.decode_ops.step == "mean", "kv_read_bytes"].sum()
    kv_p = p.decode_ops.loc[p.decode_ops.step == "mean", "kv_read_bytes"].sum()
    assert kv_w == pytest.approx(kv_p * 4096 / (16384 + 31.5), rel=0.02)   # reads the window per layer
    assert w.tpot_s < p.tpot_s and w.max_batch > p.max_batch
    # under the window nothing changes
    short = dict(kw, prompt=2048)
    assert engine.predict(HW, windowed, **short).tpot_s == pytest.approx(engine.predict(HW, plain, **short).tpot_s,
                                                                        rel=0.02)


def test_trace_override_and_des_kv_are_capped_per_layer(tmp_path):
    m = mistral_v01(tmp_path, window=1000)
    override = np.full((9, m.n_layers), 3000.0)
    capped = kvlen.windowed_per_layer(m, override)
    assert capped.max() == 1000 and override.max() == 3000      # a copy, the input untouched
    r = engine.evaluate(HW, m, "keyformer", batch=1, prompt=6000, gen=8, cache_ratio=0.5, recent_ratio=0.3,
                        beams=1, kv_dtype="bf16", weight_dtype="bf16", profile="fused", kv_override=override)
    assert r["peak_kv_tokens"][0] == pytest.approx(1001)
    steps = PolicyKV("full", 1.0, m).decode_kv(0, 6000, 8)
    assert steps.max() == pytest.approx(1000) and PolicyKV("full", 1.0).decode_kv(0, 6000, 8).min() == 6000


def test_des_trace_kv_is_capped_per_layer(tmp_path):
    from sim.des.analytic import TraceKV
    m = mistral_v01(tmp_path, window=1000)

    class FakeTrace:
        def kv_override_per_sample(self, policy, cache_ratio, prompt, gen, n_layers, heads="mean"):
            return [np.full((gen + 1, n_layers), 3000.0)], ["s0"]

    assert TraceKV(FakeTrace(), "full", 1.0, m.n_layers, model=m).decode_kv(0, 3000, 4).max() == 1000
    assert TraceKV(FakeTrace(), "full", 1.0, m.n_layers).decode_kv(0, 3000, 4).max() == 3000


def test_gemma3_270m_interleaves_five_local_layers_per_global_one():
    """The shipped Gemma-3-270M: 18 layers, every 6th global, the others keep the last 512 tokens; MQA."""
    m = load_model("gemma-3-270m")
    assert m.n_params() == pytest.approx(268.1e6, rel=1e-3) and m.attention == "MQA" and m.tied_embeddings
    assert m.sliding_window == 512 and m.sliding_layers == tuple(i for i in range(18) if (i + 1) % 6)
    # a 4096-token prompt: 15 local layers hold 512, 3 global layers hold everything
    assert kvlen.kv_tokens("full", 4096, 0, 1.0, model=m) == pytest.approx((15 * 512 + 3 * 4096) / 18)
    # eviction only matters on the global layers: 0.25 of 4096 = 1024 there, the window (512) elsewhere
    assert kvlen.kv_tokens("h2o", 4096, 0, 0.25, model=m) == pytest.approx((15 * 512 + 3 * 1024) / 18)
    full = engine.predict(HW, m, batch=1, prompt=8192, gen=32, policy="full", cache_ratio=1.0)
    kf = engine.predict(HW, m, batch=1, prompt=8192, gen=32, policy="keyformer", cache_ratio=0.2)
    assert kf.max_batch > full.max_batch


@pytest.mark.parametrize("model_type, expected", [("gemma2", (0, 2, 4)), ("gemma3_text", (0, 1, 2, 3, 4)),
                                                  ("gemma", ())])
def test_gemma_layer_patterns_without_layer_types(model_type, expected):
    cfg = dict(model_type=model_type, hidden_size=256, intermediate_size=512, num_hidden_layers=6,
               num_attention_heads=4, num_key_value_heads=1, head_dim=64, vocab_size=1000,
               max_position_embeddings=8192, sliding_window=256)
    m = spec_from_config(cfg, "g")
    assert m.sliding_layers == expected and m.tied_embeddings
