"""`hf-eager` is the stack of the Keyformer paper's performance runs (MPT-7B, Hugging Face transformers
4.28 remote code, `attn_impl="torch"`, beam search; shared/docs/keyformer-paper.md §3-4):
  - cache_concat   `torch.cat([past, new])` for K and V in every layer: the whole cache is read and
                   written again each step (MPT `scaled_multihead_dot_product_attention`; also
                   transformers' DynamicCache);
  - beam_reorder   `index_select(0, beam_idx)` on K and V of every layer after every beam-search step
                   (`_reorder_cache`): another full read + write of the cache;
  (the cache copies, the repeat_kv expansion and the eviction compaction write into tensors they allocate
   anew: on devices whose file has a `fresh_alloc_efficiency` table, i.e. calibrated CPUs where glibc
   maps tensors above 32 MiB to fresh pages, they run at that fraction of the streaming rate; a GPU
   caching allocator reuses blocks, and datasheet files have no such table)
  - score_upcast   16-bit logits cast to fp32 for the softmax and back (nothing when activations are
                   already fp32);
  - repeat_kv      grouped-query models only (none in the paper's MPT): eager attention expands K and V
                   from the KV heads to the query heads in every layer (`repeat_kv`: expand + reshape
                   copies; transformers >= 4.31 Llama/Mistral/Qwen2 `eager_attention_forward`), and both
                   attention matmuls then read the expanded copies;
  - mask_bias      the n-wide ALiBi bias / causal mask added to the materialised logits in each layer,
                   plus the per-step build of the 4-D mask from the growing 2-D attention mask;
  - eager_glue     what the core operator list leaves implicit: residual adds, the elementwise parts of
                   norms and activations, RoPE, head reshapes that copy (launches and activation bytes
                   per architecture, counted from the HF modeling code);
  - the eviction policies as the paper's code runs them: the Gumbel path deep-copies the logits
                   (`copy.deepcopy`), draws noise, takes a second softmax and accumulates in separate
                   kernels (`policy_eager_passes`), and the physical-eviction variants compact the kept
                   K/V every 8 steps (`evict_compact`, amortised per step);
  - prefill: eager attention materialises the n x n logits in fp32 with an n x n mask, the Gumbel path
                   copies them, and transformers 4.28 computes LM-head logits for every prompt position.
"""
from __future__ import annotations

import numpy as np

from sim import policies
from sim.op import SCORE_BYTES, Op, OpContext
from sim.profiles.base import Profile, register_profile
from sim.profiles.eager import (EAGER_LAUNCHES, EVICT_INTERVAL, eager_glue, held_keys, kv_bytes, policy_eager_ops,
                                repeat_kv, score_elems, score_upcast)


def hf_decode_ops(ctx: OpContext) -> list[Op]:
    m, ab = ctx.model, ctx.ab
    past, keys = ctx.past_tokens, held_keys(ctx)
    elems = score_elems(ctx)
    beams_reorder = np.asarray(ctx.beams, float) > 1
    ops = []
    cache = kv_bytes(ctx, keys)          # K and V of one layer after the append
    if np.any(beams_reorder):
        # beam search: index_select over the batch*beam axis of every layer's K and V, every step.
        ops.append(Op("beam_reorder", True, kv_read_bytes=cache * beams_reorder,
                      kv_write_bytes=cache * beams_reorder, launches=2, fresh_tensor_bytes=cache / 2))
    ops += [
        # torch.cat([past_k, k]) and ([past_v, v]): read the cache, write cache + 1 token into new tensors,
        # per layer.
        Op("cache_concat", True, kv_read_bytes=kv_bytes(ctx, past), kv_write_bytes=cache,
           launches=2, fresh_tensor_bytes=cache / 2),
        # additive ALiBi bias (H x keys, read) + causal/padding mask (rows x keys) on the logits.
        Op("mask_bias", True, act_bytes=2 * elems * ab + (m.n_heads + ctx.rows) * keys * ab, launches=2),
        # once per step: the 2-D attention mask grows by cat, the 4-D additive mask is rebuilt from it.
        Op("mask_build", False, act_bytes=ctx.rows * keys * (2 * 8 + 4), launches=4),
        eager_glue(ctx),
        *repeat_kv(ctx),
    ]
    ops += score_upcast(ctx, elems)
    ops += policy_eager_ops(ctx, "hf")
    if policies.get(ctx.policy).scored:
        # physical eviction every EVICT_INTERVAL steps: gather the kept K/V into a fresh buffer.
        ops.append(Op("evict_compact", True, kv_read_bytes=cache / EVICT_INTERVAL,
                      kv_write_bytes=kv_bytes(ctx, past) / EVICT_INTERVAL, launches=4 / EVICT_INTERVAL,
                      fresh_tensor_bytes=kv_bytes(ctx, past) / 2))
    return ops


def hf_prefill_ops(ctx: OpContext) -> list[Op]:
    m, ab = ctx.model, ctx.ab
    n, q = held_keys(ctx), ctx.new_tokens
    elems = score_elems(ctx)
    ops = [
        # n x n additive mask (rows x 1 x q x n) built once, read by every layer's logits add.
        Op("mask_build", False, act_bytes=ctx.rows * q * n * SCORE_BYTES, launches=4),
        Op("mask_bias", True, act_bytes=2 * elems * ab + (ctx.rows * q + m.n_heads) * n * ab, launches=2),
        # transformers 4.28 generate: LM-head logits for every prompt position, not only the last.
        Op("lm_head_all_positions", False, flops=2 * ctx.rows * (q - 1) * m.vocab_size * m.d_model,
           act_bytes=ctx.rows * (q - 1) * m.vocab_size * SCORE_BYTES, launches=1, gemm=True,
           rows=ctx.rows * (q - 1)),
        eager_glue(ctx),
        *repeat_kv(ctx),
    ]
    ops += score_upcast(ctx, elems)
    path = policies.get(ctx.policy).eager_path("hf")
    if path is not None:
        # the score path over the n x n logits (keyformer's Gumbel path: copy.deepcopy, noise, noisy
        # softmax, column sums)
        ops.append(Op("policy_eager_passes", True, flops=path["score_passes"] * elems,
                      act_bytes=path["score_passes"] * elems * SCORE_BYTES, launches=path["score_launches"]))
    return ops


PROFILE = HF_EAGER = register_profile(Profile(
    name="hf-eager",
    description="Hugging Face transformers eager stack as in the Keyformer paper's runs (4.28, MPT remote "
                "code, attn_impl=torch, beam search): torch.cat cache growth, beam reorder copies, "
                "materialised logits with fp32 upcast and n-wide masks, eager glue kernels, the Gumbel "
                "path's copies and lazy physical eviction (sim/profiles/hf_eager.py)",
    launches={**EAGER_LAUNCHES, "kv_write": 0},   # the new K/V enter through cache_concat
    materialise_scores=True,
    prefill_chunk_tokens=None,                     # eager prefill holds all n x n logits at once
    extra_decode_ops=hf_decode_ops,
    extra_prefill_ops=hf_prefill_ops,
    eager=True,
))
