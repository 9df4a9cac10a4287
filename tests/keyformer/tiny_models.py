"""Tiny random models built in code (2 layers, small dims, eager attention, fp32) for the policy tests."""
from __future__ import annotations

import torch
from transformers import (GPT2Config, GPT2LMHeadModel, GPTJConfig, GPTJForCausalLM, GPTNeoXConfig,
                          GPTNeoXForCausalLM, LlamaConfig, LlamaForCausalLM, MptConfig, MptForCausalLM)

VOCAB = 128


def gpt2():  # learned absolute positions (the Cerebras-GPT architecture)
    return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=256, n_embd=64, n_layer=2, n_head=4,
                                      bos_token_id=1, eos_token_id=2))


def gptj():  # RoPE on part of the head (rotary_dim < head_dim), interleaved
    return GPTJForCausalLM(GPTJConfig(vocab_size=VOCAB, n_positions=256, n_embd=64, n_layer=2, n_head=4,
                                      rotary_dim=8, bos_token_id=1, eos_token_id=2))


def llama_gqa():  # RoPE, 4 query heads over 2 KV heads
    return LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                        max_position_embeddings=256))


def neox():  # partial rotary (rotary_pct 0.5), parallel residual
    return GPTNeoXForCausalLM(GPTNeoXConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                                            num_hidden_layers=2, num_attention_heads=4,
                                            max_position_embeddings=256, rotary_pct=0.5, bos_token_id=1, eos_token_id=2))


def mpt():  # ALiBi; MptConfig defaults to use_cache=False
    return MptForCausalLM(MptConfig(vocab_size=VOCAB, d_model=64, n_heads=4, n_layers=2, max_seq_len=256,
                                    use_cache=True))


ARCHITECTURES = {"gpt2": gpt2, "gptj": gptj, "llama_gqa": llama_gqa, "neox": neox, "mpt": mpt}


def build(arch: str, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = ARCHITECTURES[arch]()
    model.set_attn_implementation("eager") if arch != "mpt" else None
    model.generation_config.pad_token_id = 0
    return model.eval()
