"""The one factory of random-weight models: a causal LM built from an HF config dict (no download, no
weights file), and the tiny two-layer shapes the tests and smoke runs use.

    model = random_model(tiny_config("llama", vocab_size=256, positions=4096), seed=0)
    model = random_model(json.loads(Path("config.json").read_text()), dtype="bf16", device="cuda")

Latency does not depend on the weights' values, so timing runs build any shape this way; quality results
never come from these models (their outputs are meaningless text).
"""
from __future__ import annotations

import torch

from keyformer.dtypes import torch_dtype

# Two layers, 64 wide, 4 heads: each builds and runs in well under a second.
TINY_SHAPES = {
    "gpt2": {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4},   # learned absolute positions
    "gptj": {"model_type": "gptj", "n_embd": 64, "n_layer": 2, "n_head": 4, "rotary_dim": 8},   # partial RoPE
    "llama": {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2},            # RoPE, 4 query heads over 2 KV heads
    "neox": {"model_type": "gpt_neox", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "rotary_pct": 0.5},                   # partial rotary, parallel residual
    "mpt": {"model_type": "mpt", "d_model": 64, "n_heads": 4, "n_layers": 2, "use_cache": True},   # ALiBi
    # Gemma 3's interleaved local/global attention, shrunk: sliding (window 8), sliding, global; GQA 4 over 2,
    # a query_pre_attn_scalar scale and Gemma's norms (window and layer count at Gemma-3-270M's 512, 18)
    "gemma3": {"model_type": "gemma3_text", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3,
               "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "query_pre_attn_scalar": 16,
               "sliding_window": 8, "layer_types": ["sliding_attention", "sliding_attention", "full_attention"]},
    # Mistral: every layer a sliding window (Mistral-7B-v0.1: 4096)
    "mistral": {"model_type": "mistral", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "sliding_window": 8},
}
# the config key of each architecture's position limit
POSITIONS_KEY = {"gpt2": "n_positions", "gptj": "n_positions", "llama": "max_position_embeddings",
                 "neox": "max_position_embeddings", "mpt": "max_seq_len",
                 "gemma3": "max_position_embeddings", "mistral": "max_position_embeddings"}


def tiny_config(arch: str, vocab_size: int, positions: int, **extra) -> dict:
    """The HF config dict of a tiny `arch` model (TINY_SHAPES), with its vocabulary, position limit and
    any other config keys (`bos_token_id`, `tie_word_embeddings`, ...)."""
    if arch not in TINY_SHAPES:
        raise ValueError(f"unknown tiny architecture {arch!r} (choose from {', '.join(TINY_SHAPES)})")
    return {**TINY_SHAPES[arch], "vocab_size": vocab_size, POSITIONS_KEY[arch]: positions, **extra}


def random_model(config: dict, seed: int = 0, dtype: str = "fp32", device: str = "cpu",
                 attn: str | None = "eager") -> torch.nn.Module:
    """A random-weight causal LM of this HF config dict (keys starting with `_` are notes, not config), in
    eval mode, seeded. attn: the attention implementation (eager: the policies need probabilities; None
    keeps the architecture's own, for models whose attention is hand-written, e.g. MPT)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {k: v for k, v in config.items() if not k.startswith("_") and k not in ("architectures",)}
    model_type = fields.pop("model_type")
    try:
        hf_config = AutoConfig.for_model(model_type, **fields)
    except ValueError as exc:
        raise ValueError(f"cannot build a {model_type!r} model: {str(exc).splitlines()[0]}") from None
    kwargs = {"dtype": torch_dtype(dtype)}
    if attn is not None:
        hf_config._attn_implementation = attn
        kwargs["attn_implementation"] = attn
    torch.manual_seed(seed)
    # Built directly on the device: a 7B model initialised on the CPU first would cost minutes.
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(hf_config, **kwargs)
    return model.eval()
