"""`hf`: plain Hugging Face transformers as most people run it (transformers 5 defaults).

`model.generate(...)` with the default attention (`attn_implementation="sdpa"`), the default cache
(DynamicCache) and greedy decoding, read off transformers 5.24's code:
  - attention      one `torch.nn.functional.scaled_dot_product_attention` call per layer (a fused
                   kernel: the logits never go through memory, no fp32 upcast, no additive mask at
                   decode: sdpa_mask returns None when a causal mask can be skipped); grouped-query
                   models run it on the KV heads (`enable_gqa` / `pack_gqa` in
                   transformers/integrations/sdpa_attention.py): no repeat_kv copies;
  - cache_concat   DynamicCache grows by `torch.cat([keys, new], dim=-2)` for K and V in every layer
                   every step (DynamicLayer.update): the whole cache is read and written again into
                   newly allocated tensors (fresh pages on CPUs whose file has a fresh_alloc table);
  - greedy         argmax of the last position's logits (logits_to_keep=1: the LM head runs on one
                   position, at prefill too); no beam reorder;
  - logits_fp32    generate() copies those logits to fp32 before the logits processors and the argmax
                   (`outputs.logits[:, -1].to(copy=True, dtype=torch.float32)` in GenerationMixin._sample):
                   rows x vocab read at the activation dtype, written and read again at 4 bytes, every step;
  - eager_glue     the modeling code's own elementwise kernels (norm internals, RoPE, activation,
                   residual adds), as hf-eager counts them (sim/profiles/eager.GLUE);
  - generate_step  the per-step work of generate() outside the layers (embedding, rotary tables, cache
                   position, logits processors, argmax, stopping criteria, input-id and mask growth):
                   HF_STEP_LAUNCHES top-level calls (counted, see below).
Launches are top-level eager calls (`eager=True`: the device's calibrated eager_call_overhead_s).
Memory on top of weights, KV and one layer's activations (`hf_memory_bytes`): torch.cat's output exists
beside its inputs (one layer's K and V twice), the eager gated MLP holds three d_ff-wide tensors at once
(act(gate), up and their product) where the shared rule counts two, the bf16 logits beside their fp32 copy.
A policy that evicts runs layer by layer at prefill (`layerwise_prefill_eviction`): each layer's cache is
compressed right after that layer's prefill (kvpress-style forward hooks), so the prefill peak holds the
full prompt in one layer and the kept tokens in the others (sim.engine.memory.peak_kv_tokens).
No fitted term of its own: the profile is operators and counts (on a GPU its decode attention takes the
FlashAttention-2 kernel family's rate, pinned by kernel-level measurements); its CPU check is `traces.timing --stack hf
--attn sdpa --beams 1` (docs/validation.md).
"""
from __future__ import annotations

import functools

import numpy as np

from sim.op import Op, OpContext
from sim.profiles.base import DECODE_ATTENTION_OPS, Profile, register_profile
from sim.profiles.eager import EAGER_LAUNCHES, eager_glue, held_keys, kv_bytes

# Top-level aten calls of one greedy generate() step (aten ops without an aten parent), counted with
# torch.profiler on 2- and 4-layer tiny random models (hidden 64; never a validation shape; transformers
# 5.24, sdpa, DynamicCache, batch 2, 32-token prompt; benchmarks/hf_launch_count.py): llama-GQA 55
# per layer and 54 outside the layers, gpt2 39 and 42. The core operators, cache_concat and the LM head
# count their own launches (12 per layer; embed, final norm, LM head 3 per step); the rest is here.
# Only counts are taken; the time per call is the hardware file's eager_call_overhead.
HF_GLUE_LAUNCHES = {"llama": 43, "mistral": 43, "qwen2": 43, "gpt2": 27}
HF_STEP_LAUNCHES = {"llama": 51, "mistral": 51, "qwen2": 51, "gpt2": 39}
HF_DEFAULT_STEP_LAUNCHES = 51

SDPA_LAUNCHES = {**EAGER_LAUNCHES, "attn_scores": 1, "softmax": 0, "attn_v": 0, "kv_write": 0}


# bytes per logit of generate()'s fp32 copy: written once, read once by the argmax
LOGIT_COPY_BYTES = 4 + 4


def logits_fp32(ctx: OpContext) -> Op:
    """generate()'s fp32 copy of the last position's logits and the argmax over it (once per step; its
    launches are among HF_STEP_LAUNCHES, counted with the profiler)."""
    logits = ctx.rows * ctx.model.vocab_size
    return Op("logits_fp32", False, flops=logits, act_bytes=logits * (ctx.ab + LOGIT_COPY_BYTES), launches=0)


def hf_sdpa_decode_ops(ctx: OpContext) -> list[Op]:
    m = ctx.model
    past, keys = ctx.past_tokens, held_keys(ctx)
    return [
        # DynamicLayer.update: torch.cat for K and V of every layer; the outputs are new tensors
        Op("cache_concat", True, kv_read_bytes=kv_bytes(ctx, past), kv_write_bytes=kv_bytes(ctx, keys),
           launches=2, fresh_tensor_bytes=kv_bytes(ctx, keys) / 2),
        eager_glue(ctx, HF_GLUE_LAUNCHES.get(m.model_type)),
        Op("generate_step", False, act_bytes=ctx.rows * m.d_model * ctx.ab,
           launches=HF_STEP_LAUNCHES.get(m.model_type, HF_DEFAULT_STEP_LAUNCHES)),
        logits_fp32(ctx),
    ]


def sdpa_decode_rate(ctx: OpContext, ops: list[Op]) -> None:
    """Decode attention runs SDPA's kernel. On a CPU it loops over (sequence, query head): its FLOPs
    (q.k, softmax, p.v per query head and key) run at the device's calibrated SDPA rate where the file
    has one (hwmodels sdpa_decode_efficiency); its bytes stay at the streaming rate, read once per K/V
    head. A grouped-query model thus pays its query heads, not only its K/V bytes (measured 2026-12-01:
    16 query heads on 4 K/V heads over 3005 keys, d = 64, cost 62% of the 16-K/V-head call).
    On a GPU, SDPA at q_len = 1 without a mask and with native GQA dispatches to its FlashAttention-2
    kernel (transformers' sdpa_attention_forward passes enable_gqa; PyTorch's flash backend takes it):
    the tensor-core decode family of sim/profiles/attention.py, which streams K/V at its plateau after a
    fixed time per kernel (terms pinned by the kernel-level rows of ../shared/data/gpu-attention-kernels.csv
    in sim.fit_profiles; the fit file's shared kernel terms), so one short sequence reaches a small
    fraction of the bandwidth and a long one nearly the plateau."""
    if ctx.phase != "decode" or ctx.hw is None:
        return
    from sim.profiles import device_class
    if device_class(ctx.hw) == "gpu" and hasattr(ctx.hw, "bw_efficiency"):
        scale = flash_decode_bw_scale(ctx)
        for op in ops:
            if op.name in DECODE_ATTENTION_OPS:
                op.bw_scale = scale
        return
    tables = getattr(ctx.hw, "tables", None)
    eff = None if tables is None else tables.sdpa_decode_efficiency(ctx.model.head_dim)
    if eff is None:
        return
    for op in ops:
        if op.name in DECODE_ATTENTION_OPS:
            op.compute_eff = eff


@functools.lru_cache(maxsize=1)
def _kernel_terms() -> dict:
    """The decode-attention kernel terms of the engine fit file (vLLM's entry: it runs FlashAttention for
    decode too; the kernel terms are shared by the engines), or their priors before a fit."""
    from sim.profiles import engines
    if not engines.FIT_FILE.is_file():
        return engines.prior_values()
    return engines.engine_values(engines.read_fit_file(engines.FIT_FILE), "vllm", engines.FIT_FILE)


def flash_decode_bw_scale(ctx: OpContext):
    """Op.bw_scale that makes one layer's decode attention over B bytes of K and V stream at the tensor-core
    family's efficiency (attention.stream_eff) instead of the device's streaming curve. The kernel is sized by
    every byte the fused op moves (attention.decode_kernel_bytes, as sim.profiles.engines sizes it): with K and
    V alone the fixed latency would be charged again per byte of the queries, and a smaller cache could take
    longer."""
    from sim.profiles import attention
    hw = ctx.hw
    kernel_bytes = np.maximum(np.asarray(attention.decode_kernel_bytes(ctx), float), 1.0)
    eff = np.minimum(attention.stream_eff("tensor-core", kernel_bytes, float(hw.memory_bw), _kernel_terms()), 1.0)
    scale = eff / np.asarray(hw.bw_efficiency(kernel_bytes), float)
    return scale if np.ndim(scale) else float(scale)


def hf_sdpa_prefill_ops(ctx: OpContext) -> list[Op]:
    ops = [eager_glue(ctx, HF_GLUE_LAUNCHES.get(ctx.model.model_type))]
    return ops + [logits_fp32(ctx)] if ctx.completes_prompt else ops


def hf_memory_bytes(setup, rows, kv_tokens, prompt):
    """What the eager transformers stack holds beyond sim.capacity.memory's weights, KV, one layer's
    activations and fp32 logits: torch.cat's new cache beside the old one (one layer's K and V at the
    larger of the prompt, whose K/V the prefill concatenates, and the held tokens), the gated MLP's third
    d_ff-wide tensor per prefill token (act(gate) * up beside both factors), the logits at the activation
    dtype beside their fp32 copy."""
    m, rows = setup.model, np.asarray(rows, float)
    one_layer_kv = 2.0 * m.n_kv_heads * m.head_dim * setup.kvb
    cat_copy = rows * np.maximum(np.asarray(kv_tokens, float), np.asarray(prompt, float)) * one_layer_kv
    mlp_third = rows * np.asarray(prompt, float) * m.d_ff * setup.ab if m.gated_mlp else 0.0
    return cat_copy + mlp_third + rows * m.vocab_size * setup.ab


PROFILE = HF = register_profile(Profile(
    name="hf",
    description="Hugging Face transformers defaults (5.x): SDPA attention (fused, native GQA: no repeat_kv), "
                "DynamicCache growth by torch.cat per layer per step, greedy decoding, eager glue kernels "
                "(sim/profiles/hf.py)",
    launches=SDPA_LAUNCHES,
    materialise_scores=False,
    prefill_chunk_tokens=None,
    extra_decode_ops=hf_sdpa_decode_ops,
    extra_prefill_ops=hf_sdpa_prefill_ops,
    eager=True,
    adjust_ops=sdpa_decode_rate,
    extra_memory_bytes=hf_memory_bytes,
    layerwise_prefill_eviction=True,
))
