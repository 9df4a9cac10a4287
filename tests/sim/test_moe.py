"""Mixture-of-experts models (Mixtral): the spec's experts, the experts a pass reads, and the MLP operator's
FLOPs and weight bytes that follow from them; dense models unchanged."""
from __future__ import annotations

import numpy as np
import pytest

from hwmodels import load_device
from sim import engine
from sim.models import load_model, spec_from_config
from sim.parallel.shard import shard_model

MIXTRAL_TINY = {"model_type": "mixtral", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 100, "max_position_embeddings": 128,
                "num_local_experts": 8, "num_experts_per_tok": 2}


# The model cards' total and active (per-token) sizes check the specs written from memory.
@pytest.mark.parametrize("name, total, active", [("mixtral-8x7b", 46.7e9, 12.9e9), ("mixtral-8x22b", 141e9, 39e9)])
def test_mixtral_specs_match_the_model_cards(name, total, active):
    m = load_model(name)
    assert (m.n_experts, m.experts_per_token, m.moe) == (8, 2, True)
    assert m.n_params() == pytest.approx(total, rel=0.01)
    assert m.weight_bytes_read(1, "bf16") / 2 == pytest.approx(active, rel=0.01)
    assert m.weight_bytes("bf16") == 2 * m.n_params()          # memory holds every expert


def test_experts_touched_runs_from_k_to_all_experts():
    m = load_model("mixtral-8x7b")
    touched = m.experts_touched(np.array([1, 2, 4, 16, 64, 4096]))
    assert touched[0] == pytest.approx(2.0) and touched[1] == pytest.approx(3.5)    # 8 (1 - (6/8)^2)
    assert np.all(np.diff(touched) > 0) and touched[-1] == pytest.approx(8.0) and touched.max() <= 8.0
    dense = load_model("llama-2-7b")
    assert dense.experts_touched(7) == 1.0 and dense.weight_bytes_read(7, "fp8") == dense.weight_bytes("fp8")


def test_the_mixtral_reader_and_its_checks():
    spec = spec_from_config(MIXTRAL_TINY, name="tiny-moe")
    assert (spec.n_experts, spec.experts_per_token, spec.d_ff, spec.n_kv_heads) == (8, 2, 96, 2)
    assert spec.mlp_params_per_layer() == 8 * 3 * 64 * 96 + 64 * 8            # experts + router
    with pytest.raises(ValueError, match="experts_per_token=9 exceeds n_experts=8"):
        spec_from_config({**MIXTRAL_TINY, "num_experts_per_tok": 9}, name="bad")
    with pytest.raises(ValueError, match="missing field num_local_experts"):
        no_experts = {k: v for k, v in MIXTRAL_TINY.items() if k != "num_local_experts"}
        spec_from_config(no_experts, name="bad", where="c.json")


def test_dense_specs_keep_their_dict_and_hash_shape():
    d = load_model("llama-2-7b").to_dict()
    assert "n_experts" not in d and "experts_per_token" not in d
    assert load_model("mixtral-8x7b").to_dict()["n_experts"] == 8


def _mlp(pred, step="mean"):
    t = pred.decode_ops
    return t[(t["step"] == step) & (t["op"] == "mlp")].iloc[0]


def test_decode_reads_the_routed_experts_and_runs_k_of_them():
    hw, m = "h100-sxm", load_model("mixtral-8x7b")
    one = engine.predict(hw, m, 1, 128, 16, "full", 1.0, kv_dtype="fp8", weight_dtype="fp8", profile="fused")
    many = engine.predict(hw, m, 64, 128, 16, "full", 1.0, kv_dtype="fp8", weight_dtype="fp8", profile="fused")
    expert, layers = m.expert_params(), m.n_layers
    # bytes (the table sums the layers; fp8 = 1 byte per weight): 2 of 8 experts at one token, nearly all 8 at 64
    assert _mlp(one)["weight_bytes"] == pytest.approx(layers * (2 * expert + m.router_params()), rel=1e-6)
    assert _mlp(many)["weight_bytes"] == pytest.approx(
        layers * (float(m.experts_touched(64)) * expert + m.router_params()), rel=1e-6)
    # FLOPs: k experts per token, never all of them
    assert _mlp(one)["flops"] == pytest.approx(layers * 2 * (2 * expert + m.router_params()), rel=1e-6)
    assert _mlp(many)["flops"] == pytest.approx(64 * _mlp(one)["flops"], rel=1e-6)
    assert one.tpot_s < many.tpot_s < 64 * one.tpot_s


@pytest.mark.parametrize("batch", [1, 4, 64])
def test_moe_steps_respect_the_bandwidth_floor_of_what_they_read(batch):
    hw, m = load_device("h100-sxm"), load_model("mixtral-8x7b")
    ctx = 1024
    step = float(engine.decode_step_time(hw, m, np.full(batch, ctx), weight_dtype="fp8", kv_dtype="fp8",
                                         policy="full", profile="fused"))
    floor = (m.weight_bytes_read(batch, "fp8") + batch * ctx * m.kv_bytes_per_token("fp8")) / hw.memory_bw
    assert step >= floor
    # a dense model with the active parameters would read less at batch 64: all experts are touched there
    if batch == 64:
        assert m.weight_bytes_read(batch, "fp8") > 0.95 * m.weight_bytes("fp8")


def test_tensor_parallel_shards_every_expert():
    m = load_model("mixtral-8x7b")
    s = shard_model(m, tp=2)
    assert (s.n_experts, s.experts_per_token, s.d_ff) == (8, 2, m.d_ff // 2)
    assert 2 * s.n_params() == pytest.approx(m.n_params(), rel=0.02)
