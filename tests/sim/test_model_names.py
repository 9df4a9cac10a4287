"""sim.model_names: published and Hugging Face names -> shipped specs (sim/models/names.yaml), used by load_model
and the published-GPU rows."""
import pytest

from sim.model_names import normal_form, resolve_name
from sim.models import load_model


@pytest.mark.parametrize("label, spec", [
    ("meta-llama/Llama-2-7b-hf", "llama-2-7b"), ("meta-llama/Llama-2-70b-chat-hf", "llama-2-70b"),
    ("Llama2 13B", "llama-2-13b"), ("meta-llama/Meta-Llama-3-8B-Instruct", "llama-3-8b"),
    ("nvidia/Llama-3.1-8B-Instruct-FP8", "llama-3.1-8b"), ("Llama 3.1 8B", "llama-3.1-8b"),
    ("meta/llama-3.3-70b-instruct (NIM 1.8.0)", "llama-3.1-70b"), ("amd/Llama-3.1-70B-Instruct-FP8-KV", "llama-3.1-70b"),
    ("meta-llama/Meta-Llama-3-70B", "llama-3.1-70b"), ("meta-llama/Llama-3.1-405B-Instruct-FP8", "llama-3.1-405b"),
    ("mistralai/Mistral-7B-v0.1", "mistral-7b-v0.1"), ("mistralai/Mistral-7B-Instruct-v0.1", "mistral-7b-v0.1"),
    ("mistralai/Mistral-7B-Instruct-v0.3", "mistral-7b"), ("EleutherAI/gpt-j-6b", "gpt-j-6b"), ("GPT-J 6B", "gpt-j-6b"),
    ("google/gemma-3-270m-it", "gemma-3-270m"), ("llama-2-7b", "llama-2-7b"),
])
def test_names_resolve_to_the_spec_with_their_shapes(label, spec):
    assert resolve_name(label).spec == spec
    assert load_model(label).name == spec


def test_llama_3_family_shapes():
    for name, (layers, d, heads, ff) in {"llama-3.1-8b": (32, 4096, 32, 14336), "llama-3.1-70b": (80, 8192, 64, 28672),
                                          "llama-3.1-405b": (126, 16384, 128, 53248)}.items():
        m = load_model(name)
        assert (m.n_layers, m.d_model, m.n_heads, m.n_kv_heads, m.d_ff, m.vocab_size, m.max_positions) == (
            layers, d, heads, 8, ff, 128256, 131072)
    assert load_model("llama-3.1-70b").n_params() == pytest.approx(70.6e9, rel=0.01)
    assert load_model("llama-3.1-405b").n_params() == pytest.approx(405.9e9, rel=0.01)


@pytest.mark.parametrize("label, why", [("deepseek-ai/DeepSeek-V3", "mixture-of-experts"),
                                        ("deepseek-ai/DeepSeek-R1", "mixture-of-experts"),
                                        ("microsoft/phi-2", "no shipped spec"), ("acme/llama-9", "no shipped spec")])
def test_names_without_a_spec_say_why(label, why):
    res = resolve_name(label)
    assert res.spec is None and why in res.reason
    with pytest.raises(ValueError, match=why) as info:
        load_model(label)
    assert "\n" not in str(info.value)


def test_normal_form_drops_org_remarks_and_shape_neutral_words():
    assert normal_form("meta/Llama-3.3-70B-Instruct (NIM 1.8.0)") == "llama-3.3-70b"
    assert normal_form("Llama2_7B chat") == "llama-2-7b"


def test_paths_still_mean_files(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_model(str(tmp_path / "missing" / "config.json"))
    with pytest.raises(FileNotFoundError):
        load_model("./nowhere")
