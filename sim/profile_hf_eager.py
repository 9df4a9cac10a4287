"""Eager PyTorch software stacks as explicit operators: `hf-eager` and `kvsim-eager`.

The fused profile (sim/profiles.py) is the ideal: one pass over the weights and the kept KV per step.
Eager PyTorch code moves more bytes and launches more kernels than that, and *which* extra operators it
runs is readable in its source. This module writes them down, one `Op` each, with bytes and kernel
counts from the code, so an eager prediction is the ideal one plus named, inspectable rows of the
operator table (never a multiplier).

`hf-eager` is the stack of the Keyformer paper's performance runs (MPT-7B, Hugging Face transformers
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

`kvsim-eager` is this project's own stack (keyformer/: slot cache on transformers 5 eager modules, run
by traces.timing on CPU): no concatenation and no reordering (a decode step scatters the newcomer into a
free slot), but the same eager attention (fp32 logits, a slot mask built per layer from the slot
positions, separate softmax), the same glue, and the policy's score path as separate eager kernels. It is
the profile the CPU validation uses: the measured points run exactly this code.
"""
from __future__ import annotations

import numpy as np

from sim import policies
from sim.op import SCORE_BYTES, Op, OpContext
from sim.profiles import Profile, register_profile

# ---------------------------------------------------------------------------------------------------
# Eager glue per architecture, per layer, at one token per row: (kernel launches, activation passes over
# d_model, passes over d_ff, passes over the q/k heads). Counted from transformers' modeling code:
#   llama: RMSNorm x2 = (to fp32, pow, mean, add eps, rsqrt, mul, mul weight, cast) ~ 7 kernels and
#          ~6 passes over d each; RoPE on q and k = (mul cos, slice/neg/cat rotate_half, mul sin, add) ~ 6
#          kernels each, ~5 passes; SiLU and gate*up 2 kernels, 3 passes over d_ff; 2 residual adds (3
#          passes over d each); transpose(1,2).reshape of the attention output copies once.
#   gpt2:  LayerNorm x2 (1 fused kernel, 2 passes each); split of c_attn + 3 head reshapes (views) and
#          the merge of heads (1 copy); gelu_new = 0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*x**3))) 8 kernels,
#          ~16 passes over d_ff; 2 residual adds; biases are fused into addmm.
#   mpt:   LayerNorm x2 (low-precision layernorm casts: 3 kernels each), Wqkv chunk + rearranges (3
#          copies), GELU 1 kernel (2 passes over d_ff), 2 residual adds.
#   gptj:  LayerNorm x1 (parallel block), RoPE on rotary dims (~10 kernels), gelu_new (8 kernels), 2 adds.
GLUE = {
    "llama": dict(launches=2 * 7 + 2 * 6 + 2 + 2 + 1, d_passes=2 * 6 + 2 * 3 + 2, ff_passes=3, head_passes=5),
    "mistral": dict(launches=2 * 7 + 2 * 6 + 2 + 2 + 1, d_passes=2 * 6 + 2 * 3 + 2, ff_passes=3, head_passes=5),
    "qwen2": dict(launches=2 * 7 + 2 * 6 + 2 + 2 + 1, d_passes=2 * 6 + 2 * 3 + 2, ff_passes=3, head_passes=5),
    "gpt2": dict(launches=2 + 1 + 1 + 8 + 2, d_passes=2 * 2 + 2 * 3 + 2, ff_passes=16, head_passes=2),
    "mpt": dict(launches=2 * 3 + 3 + 1 + 2, d_passes=2 * 4 + 2 * 3 + 2, ff_passes=2, head_passes=6),
    "gptj": dict(launches=3 + 10 + 8 + 2, d_passes=2 + 2 * 3 + 2, ff_passes=16, head_passes=8),
}
DEFAULT_GLUE = dict(launches=20, d_passes=16, ff_passes=4, head_passes=4)

# The same glue in this project's stack (transformers 5.24 modules under keyformer/'s attention function),
# counted rather than read: torch.profiler on the 2- and 4-layer tiny test models (tiny-llama, tiny-gpt2;
# never on a validation shape) gives the top-level torch calls of one decode step, i.e. the ones Python
# dispatches itself (views and reshapes included, nested aten calls not). Per layer, llama: 82 (full) and
# 86 (keyformer); gpt2: 66 and 69; per step outside the layers: llama 31 / 42, gpt2 19 / 30. Subtracting
# the kernels the other operators already count (core ops 15, slot bookkeeping 4, slot mask 3 for full,
# keyformer's score and eviction path 9 + 8 per step) leaves the glue launches below. Only counts are taken
# from the profiler; the time per call is the hardware file's calibrated dispatch overhead.
KVSIM_GLUE_LAUNCHES = {"llama": 60, "mistral": 60, "qwen2": 60, "gpt2": 44}
KVSIM_STEP_LAUNCHES = {"llama": 31, "mistral": 31, "qwen2": 31, "gpt2": 19}

# Eager kernels per core operator (sim.ops names). One eager torch call is one kernel launch; views are
# free. Counted for one layer (per_layer ops) or one step.
EAGER_LAUNCHES = {
    "embed": 1,
    "norms": 2,          # the norm kernels themselves; their elementwise internals are in eager_glue
    "qkv_proj": 3,       # q, k, v linears (GPT-2/MPT: one fused linear + split copies, counted in glue)
    "kv_write": 2,       # kvsim-eager: scatter_ of K and V into the free slot (hf-eager: replaced by cat)
    "attn_scores": 2,    # matmul + scale
    "softmax": 1,
    "attn_v": 1,
    "out_proj": 1,
    "mlp": 3,            # up (+gate) and down projections; activation kernels in eager_glue
    "final_norm": 1,
    "lm_head": 1,
    "score_update": 2,   # replaced by the explicit eager passes below for the policies' own code
    "select_evict": 1,
    "select_topk": 2,
    "compact": 4,
}

# The policies' score path as eager kernels (kernels per layer and step, full passes over the rows x query
# heads x kept fp32 score tensor) is each policy's own: sim.policies.<name>.eager_paths, stacks "kvsim"
# (keyformer/) and "hf" (the paper's MPT code).
# The paper's physical-eviction variants compact K/V every EVICT_INTERVAL steps (attention_keyformer_*).
EVICT_INTERVAL = 8
# Keys of a decode step that are masked per layer by the slot mask / n-wide mask: bytes per element of the
# mask source (long slot positions read, fp32 bias written).
SLOT_MASK_BYTES = 8 + 4


def _kv_bytes(ctx: OpContext, tokens) -> object:
    """Bytes of K and V for `tokens` cached tokens of every row (one layer)."""
    m = ctx.model
    return 2 * ctx.rows * m.n_kv_heads * tokens * m.head_dim * ctx.kvb


def _score_elems(ctx: OpContext) -> object:
    """Logit elements of one layer: rows x query heads x new tokens x keys attended."""
    keys = ctx.past_tokens + (ctx.new_tokens + 1) * 0.5
    return ctx.rows * ctx.model.n_heads * ctx.new_tokens * keys


def _keys(ctx: OpContext) -> object:
    return ctx.past_tokens + ctx.new_tokens


def repeat_kv(ctx: OpContext) -> list[Op]:
    """HF eager attention of a grouped-query model: K and V of every cached key expanded to the query heads
    (read the cache once, write n_heads / n_kv_heads times as much into two new tensors), and the logits
    and output matmuls read the expanded copies, i.e. the (n_heads - n_kv_heads) share beyond what
    attn_scores / attn_v read."""
    m = ctx.model
    if m.n_heads == m.n_kv_heads:
        return []
    cached = _kv_bytes(ctx, _keys(ctx))
    expanded = cached * m.n_heads / m.n_kv_heads
    return [Op("repeat_kv", True, kv_read_bytes=cached, kv_write_bytes=expanded, launches=2,
               fresh_tensor_bytes=expanded / 2),
            Op("attn_expanded_read", True, kv_read_bytes=expanded - cached, launches=0)]


def eager_glue(ctx: OpContext, launches: float | None = None) -> Op:
    m, ab = ctx.model, ctx.ab
    glue = GLUE.get(m.model_type, DEFAULT_GLUE)
    tokens = ctx.rows * ctx.new_tokens
    heads = (m.n_heads + m.n_kv_heads) * m.head_dim
    act = tokens * (glue["d_passes"] * m.d_model + glue["ff_passes"] * m.d_ff + glue["head_passes"] * heads) * ab
    flops = tokens * (glue["d_passes"] * m.d_model + glue["ff_passes"] * m.d_ff + glue["head_passes"] * heads)
    return Op("eager_glue", True, flops=flops, act_bytes=act, launches=glue["launches"] if launches is None else launches)


def policy_eager_ops(ctx: OpContext, stack: str) -> list[Op]:
    """The policy's score path and eviction as separate eager kernels (decode step, one layer)."""
    path = policies.get(ctx.policy).eager_path(stack)
    if path is None:
        return []
    m = ctx.model
    kept = _keys(ctx)
    elems = ctx.rows * m.n_heads * kept
    slots = ctx.rows * m.n_kv_heads * kept
    # sim.ops already charges 2 passes over the probabilities and 2 over the score state (score_update)
    # and one over the candidates (select_evict): add what the eager code does beyond that.
    score_passes = path["score_passes"] + path["step_passes"]     # the per-step draw covers every layer once
    extra_score = max(score_passes - 2, 0) * elems * SCORE_BYTES
    extra_evict = max(path["evict_passes"] - 1, 0) * slots * SCORE_BYTES
    return [Op("policy_eager_passes", True, flops=score_passes * elems, act_bytes=extra_score + extra_evict,
               launches=path["score_launches"] + path["evict_launches"] + path["step_launches"] / m.n_layers)]


# ---------------------------------------------------------------------------------------------------
# hf-eager

def hf_decode_ops(ctx: OpContext) -> list[Op]:
    m, ab = ctx.model, ctx.ab
    past, keys = ctx.past_tokens, _keys(ctx)
    elems = _score_elems(ctx)
    beams_reorder = np.asarray(ctx.beams, float) > 1
    ops = []
    cache = _kv_bytes(ctx, keys)          # K and V of one layer after the append
    if np.any(beams_reorder):
        # beam search: index_select over the batch*beam axis of every layer's K and V, every step.
        ops.append(Op("beam_reorder", True, kv_read_bytes=cache * beams_reorder,
                      kv_write_bytes=cache * beams_reorder, launches=2, fresh_tensor_bytes=cache / 2))
    ops += [
        # torch.cat([past_k, k]) and ([past_v, v]): read the cache, write cache + 1 token into new tensors,
        # per layer.
        Op("cache_concat", True, kv_read_bytes=_kv_bytes(ctx, past), kv_write_bytes=cache,
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
                      kv_write_bytes=_kv_bytes(ctx, past) / EVICT_INTERVAL, launches=4 / EVICT_INTERVAL,
                      fresh_tensor_bytes=_kv_bytes(ctx, past) / 2))
    return ops


def score_upcast(ctx: OpContext, elems) -> list[Op]:
    """16-bit logits: softmax(x.float()).to(dtype) = two casts over the logits; none for fp32 logits.
    In a grid mixing dtypes `ctx.ab` is per point: the op is there with zero bytes and launches where
    the logits are fp32."""
    ab = ctx.ab
    if np.ndim(ab) == 0:
        return [Op("score_upcast", True, act_bytes=2 * elems * (ab + SCORE_BYTES), launches=2)] if ab < SCORE_BYTES else []
    upcast = np.asarray(ab) < SCORE_BYTES
    if not upcast.any():
        return []
    return [Op("score_upcast", True, act_bytes=np.where(upcast, 2 * elems * (ab + SCORE_BYTES), 0.0),
               launches=np.where(upcast, 2.0, 0.0))]


def hf_prefill_ops(ctx: OpContext) -> list[Op]:
    m, ab = ctx.model, ctx.ab
    n, q = _keys(ctx), ctx.new_tokens
    elems = _score_elems(ctx)
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


HF_EAGER = register_profile(Profile(
    name="hf-eager",
    description="Hugging Face transformers eager stack as in the Keyformer paper's runs (4.28, MPT remote "
                "code, attn_impl=torch, beam search): torch.cat cache growth, beam reorder copies, "
                "materialised logits with fp32 upcast and n-wide masks, eager glue kernels, the Gumbel "
                "path's copies and lazy physical eviction (sim/profile_hf_eager.py)",
    launches={**EAGER_LAUNCHES, "kv_write": 0},   # the new K/V enter through cache_concat
    materialise_scores=True,
    prefill_chunk_tokens=None,                     # eager prefill holds all n x n logits at once
    extra_decode_ops=hf_decode_ops,
    extra_prefill_ops=hf_prefill_ops,
    eager=True,
))


# ---------------------------------------------------------------------------------------------------
# kvsim-eager

def kvsim_decode_ops(ctx: OpContext) -> list[Op]:
    m = ctx.model
    keys = _keys(ctx)
    elems = _score_elems(ctx)
    slot_elems = ctx.rows * m.n_kv_heads * keys
    # attend(): logits.mul_(scaling) is one more pass over the fp32 logits. A batch whose requests share one
    # budget fills every slot (keyformer/ "dense slots"): no mask. Full attention's buffer has free slots, so
    # slot_bias builds where(positions >= 0, 0, -inf) per layer and adds it to every logit.
    masked = not policies.get(ctx.policy).evicts
    ops = [
        Op("logits_scale_mask", True,
           act_bytes=2 * elems * SCORE_BYTES + masked * (slot_elems * SLOT_MASK_BYTES + 2 * elems * SCORE_BYTES),
           launches=0 + 3 * masked),   # the scale's launch is counted in attn_scores
        # cache.update also scatters the newcomer's position and zeroes its score; the full policy
        # advances free_slot (and checks growth with a host sync).
        Op("slot_bookkeeping", True, act_bytes=ctx.rows * m.n_kv_heads * 2 * 8, launches=4),
        eager_glue(ctx, KVSIM_GLUE_LAUNCHES.get(m.model_type)),
        # per step outside the layers: embedding lookup, rotary tables, mask function, cache and output
        # wrappers, logits cast and greedy argmax (top-level calls counted as above).
        Op("eager_step_glue", False, act_bytes=ctx.rows * m.d_model * ctx.ab,
           launches=KVSIM_STEP_LAUNCHES.get(m.model_type, 20)),
    ]
    ops += policy_eager_ops(ctx, "kvsim")
    return ops


def kvsim_prefill_ops(ctx: OpContext) -> list[Op]:
    m = ctx.model
    n, q = _keys(ctx), ctx.new_tokens
    elems = _score_elems(ctx)
    ops = [
        # transformers' eager causal mask (rows x 1 x q x n, fp32) built once, added in every layer.
        Op("mask_build", False, act_bytes=ctx.rows * q * n * SCORE_BYTES, launches=6),
        Op("mask_bias", True, act_bytes=2 * elems * SCORE_BYTES + ctx.rows * q * n * SCORE_BYTES, launches=1),
        # after the prompt every policy (full too) ranks the prompt and gathers the kept K/V into the slot
        # buffer (base._select_prompt + SlotLayer.compact).
        # keyformer.generate.prefill calls the model without logits_to_keep: logits for every prompt position.
        Op("lm_head_all_positions", False, flops=2 * ctx.rows * (q - 1) * m.vocab_size * m.d_model,
           act_bytes=ctx.rows * (q - 1) * m.vocab_size * SCORE_BYTES, launches=1, gemm=True,
           rows=ctx.rows * (q - 1)),
        Op("prompt_compact", True, kv_read_bytes=_kv_bytes(ctx, n * ctx.cache_ratio),
           kv_write_bytes=_kv_bytes(ctx, n * ctx.cache_ratio + 1),
           act_bytes=ctx.rows * m.n_kv_heads * n * (8 + 4 + 8), launches=12),
        eager_glue(ctx),
    ]
    path = policies.get(ctx.policy).eager_path("kvsim")
    if path is not None:
        passes = path["score_passes"] + path["step_passes"]     # the prompt draws its noise layer by layer
        ops.append(Op("policy_eager_passes", True, flops=passes * elems, act_bytes=passes * elems * SCORE_BYTES,
                      launches=path["score_launches"] + path["step_launches"]))
    return ops


KVSIM_EAGER = register_profile(Profile(
    name="kvsim-eager",
    description="this project's keyformer/ stack on PyTorch eager (slot cache: scatter writes, no concat, "
                "no reorder copies; materialised fp32 logits with a per-layer slot mask; the policy's score "
                "path as separate kernels; eager glue kernels) - what traces.timing measures "
                "(sim/profile_hf_eager.py)",
    launches=EAGER_LAUNCHES,
    materialise_scores=True,
    prefill_chunk_tokens=None,
    extra_decode_ops=kvsim_decode_ops,
    extra_prefill_ops=kvsim_prefill_ops,
    eager=True,
))
