"""Model specs: HF config readers, shipped configs, KV bytes per token, errors."""
import json

import pytest

from sim.models import SUPPORTED_TYPES, ModelSpec, list_models, load_model, spec_from_config
from traces.assets import assets_dir, have_assets

KIB = 1024


@pytest.mark.parametrize("name, kv_dtype, kib", [
    ("gpt-j-6b", "bf16", 448),      # 2 (K,V) x 28 layers x 16 heads x 256 dims x 2 B
    ("mpt-7b", "fp16", 512),        # 2 x 32 x 32 x 128 x 2 B
    ("llama-3-8b", "bf16", 128),    # GQA: 2 x 32 x 8 KV heads x 128 x 2 B
    ("llama-2-7b", "bf16", 512),
    ("llama-2-70b", "fp8", 160),    # GQA 8 of 64 heads, 80 layers, 1 B
])
def test_kv_bytes_per_token_matches_hand_computed(name, kv_dtype, kib):
    assert load_model(name).kv_bytes_per_token(kv_dtype) == kib * KIB


# Published parameter counts (model cards / papers), within 1% (biases are ignored by the spec).
@pytest.mark.parametrize("name, params", [
    ("gpt-j-6b", 6.05e9), ("mpt-7b", 6.65e9), ("cerebras-gpt-6.7b", 6.7e9), ("llama-2-7b", 6.74e9),
    ("llama-2-13b", 13.0e9), ("llama-2-70b", 69.0e9), ("llama-3-8b", 8.03e9), ("mistral-7b", 7.25e9),
    ("opt-13b", 12.85e9), ("gpt2", 124e6), ("smollm2-135m", 134.5e6),
    # specs written from memory (their _source says so): the published sizes check the shapes
    ("qwen2.5-7b", 7.61e9), ("qwen2.5-72b", 72.7e9), ("llama-3.2-1b", 1.24e9), ("llama-3.2-3b", 3.21e9),
])
def test_parameter_counts_match_published_sizes(name, params):
    assert load_model(name).n_params() == pytest.approx(params, rel=0.01)


# Falcon ties the LM head to the embedding (FalconConfig's default), but its Hub checkpoints also store the
# lm_head copy, and the Hub's parameter counts include it.
@pytest.mark.parametrize("name, params, kv_heads", [("falcon-7b", 7.22e9, 1), ("falcon-40b", 41.8e9, 8),
                                                    ("falcon-180b", 179.5e9, 8)])
def test_falcon_shapes_match_the_hub_sizes(name, params, kv_heads):
    m = load_model(name)
    assert m.tied_embeddings and m.lm_head_params() == 0 and m.head_dim == 64 and m.n_kv_heads == kv_heads
    assert m.n_params() + m.vocab_size * m.d_model == pytest.approx(params, rel=0.01)


@pytest.mark.parametrize("cfg, kv_heads", [
    ({"new_decoder_architecture": False}, 1),                       # Falcon-7B: multi-query by default
    ({"new_decoder_architecture": False, "multi_query": False}, 4),
    ({"new_decoder_architecture": True, "num_kv_heads": 2}, 2),     # Falcon-40B/180B: grouped
])
def test_falcon_kv_heads_follow_the_decoder_architecture(cfg, kv_heads):
    spec = spec_from_config({"model_type": "falcon", **MINIMAL["falcon"], **cfg}, name="f")
    assert spec.n_kv_heads == kv_heads


def test_weight_bytes_follow_the_dtype():
    m = load_model("llama-2-7b")
    assert m.weight_bytes("bf16") == 2 * m.n_params()
    assert m.weight_bytes("fp32") == 4 * m.n_params()
    # quantised checkpoints keep the embedding, LM head and norms at 16 bits
    held = m.unquantised_params()
    assert held == 2 * 32000 * 4096 + (2 * 32 + 1) * 4096
    assert m.weight_bytes("int4") == 0.5 * (m.n_params() - held) + 2 * held
    assert m.weight_bytes("fp8") == (m.n_params() - held) + 2 * held


def test_tied_embeddings_are_held_once():
    m = load_model("smollm2-135m")
    assert m.tied_embeddings and m.lm_head_params() == 0
    assert m.unquantised_params() == m.vocab_size * m.d_model + (2 * m.n_layers + 1) * m.d_model


def test_shipped_configs_are_listed_and_load():
    names = list_models()
    expected = {"gpt-j-6b", "mpt-7b", "cerebras-gpt-6.7b", "llama-2-7b", "llama-2-13b", "llama-2-70b",
                "llama-3-8b", "mistral-7b", "opt-13b", "gpt2", "smollm2-135m", "stories260k"}
    assert expected <= set(names)
    for name in names:
        spec = load_model(name)
        assert spec.name == name and spec.source


@pytest.mark.parametrize("name, kind", [("llama-2-7b", "MHA"), ("llama-3-8b", "GQA"), ("llama-2-70b", "GQA"),
                                        ("mpt-7b", "MHA"), ("smollm2-135m", "GQA")])
def test_attention_kinds(name, kind):
    assert load_model(name).attention == kind


def test_gated_mlp_tied_embeddings_and_positions():
    assert load_model("llama-3-8b").gated_mlp and not load_model("gpt-j-6b").gated_mlp
    assert load_model("gpt2").tied_embeddings and not load_model("llama-2-7b").tied_embeddings
    assert load_model("mpt-7b").positional == "alibi"
    assert load_model("gpt-j-6b").positional == "rope"
    assert load_model("cerebras-gpt-6.7b").positional == "learned"
    # tying removes the LM head's copy of the embedding
    tied = load_model("smollm2-135m")
    assert tied.lm_head_params() == 0


MINIMAL = {
    "gpt2": {"n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 100, "n_positions": 128},
    "gptj": {"n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 100, "n_positions": 128},
    "mpt": {"d_model": 64, "n_layers": 2, "n_heads": 4, "vocab_size": 100, "max_seq_len": 128,
            "attn_config": {"alibi": True, "attn_type": "grouped_query_attention", "kv_n_heads": 2}},
    "llama": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1,
              "intermediate_size": 96, "vocab_size": 100, "max_position_embeddings": 128},
    "mistral": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                "intermediate_size": 96, "vocab_size": 100, "max_position_embeddings": 128},
    "qwen2": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "intermediate_size": 96, "vocab_size": 100, "max_position_embeddings": 128, "tie_word_embeddings": True},
    "qwen3": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 16, "intermediate_size": 96, "vocab_size": 100, "max_position_embeddings": 128},
    "gpt_neox": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 256,
                 "vocab_size": 100, "max_position_embeddings": 128},
    "opt": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "ffn_dim": 256, "vocab_size": 100,
            "max_position_embeddings": 128},
    "bloom": {"hidden_size": 64, "n_layer": 2, "n_head": 4, "vocab_size": 100},
    "mixtral": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                "intermediate_size": 96, "vocab_size": 100, "max_position_embeddings": 128, "num_local_experts": 4,
                "num_experts_per_tok": 2},
    "falcon": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100,
               "new_decoder_architecture": True, "num_kv_heads": 2},
    **{t: {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1,
           "head_dim": 16, "intermediate_size": 96, "vocab_size": 100, "max_position_embeddings": 128}
       for t in ("gemma", "gemma2", "gemma3_text")},
}
EXPECTED = {  # model_type: (n_kv_heads, d_ff, gated, tied, positional)
    "gpt2": (4, 256, False, True, "learned"), "gptj": (4, 256, False, False, "rope"),
    "mpt": (2, 256, False, True, "alibi"), "llama": (1, 96, True, False, "rope"),
    "mistral": (2, 96, True, False, "rope"), "qwen2": (2, 96, True, True, "rope"), "qwen3": (2, 96, True, False, "rope"),
    "gpt_neox": (4, 256, False, False, "rope"), "opt": (4, 256, False, True, "learned"),
    "bloom": (4, 256, False, True, "alibi"), "falcon": (2, 256, False, True, "rope"),
    "mixtral": (2, 96, True, False, "rope"),
    **{t: (1, 96, True, True, "rope") for t in ("gemma", "gemma2", "gemma3_text")},
}


@pytest.mark.parametrize("model_type", SUPPORTED_TYPES)
def test_every_supported_model_type_reads_its_own_field_names(model_type):
    spec = spec_from_config({"model_type": model_type, **MINIMAL[model_type]}, name=model_type)
    assert (spec.n_layers, spec.d_model, spec.n_heads, spec.head_dim, spec.vocab_size) == (2, 64, 4, 16, 100)
    assert (spec.n_kv_heads, spec.d_ff, spec.gated_mlp, spec.tied_embeddings, spec.positional) == EXPECTED[model_type]


def test_mqa_config():
    spec = spec_from_config({"model_type": "llama", **MINIMAL["llama"]}, name="mqa")
    assert spec.attention == "MQA"
    assert spec.kv_bytes_per_token("bf16") == 2 * 2 * 1 * 16 * 2


def test_config_file_and_model_folder(tmp_path):
    cfg = {"model_type": "llama", **MINIMAL["llama"]}
    folder = tmp_path / "tiny-llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    by_folder, by_file = load_model(folder), load_model(str(folder / "config.json"))
    assert by_folder == by_file
    assert by_folder.name == "tiny-llama"


@pytest.mark.assets
@pytest.mark.skipif(not have_assets("stories260K", "hf", "config.json"), reason="stories260K asset not present")
def test_stories260k_matches_the_asset():
    shipped = load_model("stories260k")
    real = load_model(assets_dir() / "stories260K" / "hf")
    assert shipped.to_dict() | {"name": "", "source": ""} == real.to_dict() | {"name": "", "source": ""}
    assert (shipped.n_layers, shipped.d_model, shipped.n_kv_heads, shipped.head_dim) == (5, 64, 4, 8)


@pytest.mark.parametrize("cfg, fragment", [
    ({"model_type": "t5", "d_model": 8}, "unsupported model_type 't5'"),
    ({"d_model": 8}, "unsupported model_type None"),
    ({"model_type": "llama", "hidden_size": 64}, "missing field num_attention_heads"),
    ({"model_type": "gptj", "n_embd": 64, "n_layer": 2, "n_head": 3, "vocab_size": 10, "n_positions": 8},
     "head_dim"),
])
def test_bad_configs_give_one_clear_error(cfg, fragment):
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(")) as info:
        spec_from_config(cfg, name="x", where="cfg.json")
    assert "\n" not in str(info.value)


def test_unknown_name_missing_file_and_bad_json(tmp_path):
    with pytest.raises(ValueError, match="unknown model 'llama-9'.*shipped"):
        load_model("llama-9")
    with pytest.raises(FileNotFoundError, match="not found"):
        load_model(str(tmp_path / "nope" / "config.json"))
    with pytest.raises(FileNotFoundError):
        load_model(tmp_path)                        # a folder without config.json
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not a readable JSON"):
        load_model(bad)


def test_spec_validation():
    with pytest.raises(ValueError, match="multiple"):
        ModelSpec("x", "llama", 2, 64, 4, 3, 16, 96, 100, True, False, "rope", 128)
    with pytest.raises(ValueError, match="positional"):
        ModelSpec("x", "llama", 2, 64, 4, 2, 16, 96, 100, True, False, "sinusoid", 128)


def test_content_hash_is_a_property_of_the_spec_content():
    import dataclasses
    import hashlib
    import json
    spec = load_model("llama-2-7b")
    assert spec.content_hash == load_model("llama-2-7b").content_hash
    assert len(spec.content_hash) == 16
    # the digest sim.sweep's result cache has always keyed on (sha256 of the sorted-key spec JSON)
    assert spec.content_hash == hashlib.sha256(json.dumps(spec.to_dict(), sort_keys=True).encode()).hexdigest()[:16]
    assert dataclasses.replace(spec, d_ff=spec.d_ff + 1).content_hash != spec.content_hash
