"""Tiny random models (2 layers, small dims, eager attention, fp32) for the policy tests: keyformer.tiny's
factory, one per architecture family the policies support."""
from __future__ import annotations

import torch

from keyformer.tiny import random_model, tiny_config

VOCAB = 128
POSITIONS = 256
TOKENS = {"bos_token_id": 1, "eos_token_id": 2}

ARCHITECTURES = {
    "gpt2": tiny_config("gpt2", VOCAB, POSITIONS, **TOKENS),        # learned absolute positions (Cerebras-GPT)
    "gptj": tiny_config("gptj", VOCAB, POSITIONS, **TOKENS),        # RoPE on part of the head, interleaved
    "llama_gqa": tiny_config("llama", VOCAB, POSITIONS),            # RoPE, 4 query heads over 2 KV heads
    "neox": tiny_config("neox", VOCAB, POSITIONS, **TOKENS),        # partial rotary, parallel residual
    "mpt": tiny_config("mpt", VOCAB, POSITIONS),                    # ALiBi; hand-written attention
    "gemma3": tiny_config("gemma3", VOCAB, POSITIONS, **TOKENS),    # local (window 8) / global layers
    "mistral": tiny_config("mistral", VOCAB, POSITIONS),            # every layer a sliding window of 8
}


def build(arch: str, seed: int = 0) -> torch.nn.Module:
    model = random_model(ARCHITECTURES[arch], seed, attn=None if arch == "mpt" else "eager")
    model.generation_config.pad_token_id = 0
    return model
