"""What the eager PyTorch stacks (hf-eager, kvsim-eager, hf) share: the glue kernels per architecture, the
eager kernel counts of the core operators, the repeat_kv expansion, the fp32 logit upcast and the policy's
score path as separate eager kernels (the policy's own counts: sim.policies.<name>.eager_paths).

The fused profile (sim/profiles/fused.py) is the ideal: one pass over the weights and the kept KV per step.
Eager PyTorch code moves more bytes and launches more kernels than that, and *which* extra operators it
runs is readable in its source. This module writes them down, one `Op` each, with bytes and kernel
counts from the code, so an eager prediction is the ideal one plus named, inspectable rows of the
operator table (never a multiplier).
"""
from __future__ import annotations

import numpy as np

from sim import policies
from sim.op import SCORE_BYTES, Op, OpContext

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


def kv_bytes(ctx: OpContext, tokens) -> object:
    """Bytes of K and V for `tokens` cached tokens of every row (one layer)."""
    m = ctx.model
    return 2 * ctx.rows * m.n_kv_heads * tokens * m.head_dim * ctx.kvb


def score_elems(ctx: OpContext) -> object:
    """Logit elements of one layer: rows x query heads x new tokens x keys attended."""
    keys = ctx.past_tokens + (ctx.new_tokens + 1) * 0.5
    return ctx.rows * ctx.model.n_heads * ctx.new_tokens * keys


def held_keys(ctx: OpContext) -> object:
    """Keys per KV head after this pass appends its tokens."""
    return ctx.past_tokens + ctx.new_tokens


def repeat_kv(ctx: OpContext) -> list[Op]:
    """HF eager attention of a grouped-query model: K and V of every cached key expanded to the query heads
    (read the cache once, write n_heads / n_kv_heads times as much into two new tensors), and the logits
    and output matmuls read the expanded copies, i.e. the (n_heads - n_kv_heads) share beyond what
    attn_scores / attn_v read."""
    m = ctx.model
    if m.n_heads == m.n_kv_heads:
        return []
    cached = kv_bytes(ctx, held_keys(ctx))
    expanded = cached * m.n_heads / m.n_kv_heads
    return [Op("repeat_kv", True, kv_read_bytes=cached, kv_write_bytes=expanded, launches=2,
               fresh_tensor_bytes=expanded / 2),
            Op("attn_expanded_read", True, kv_read_bytes=expanded - cached, launches=0)]


def eager_glue(ctx: OpContext, launches: float | None = None) -> Op:
    m, ab = ctx.model, ctx.ab
    glue = GLUE.get(m.model_type, DEFAULT_GLUE)
    tokens = ctx.rows * ctx.new_tokens
    heads = (m.n_heads + m.n_kv_heads) * m.head_dim
    ff = m.d_ff * m.experts_per_token              # a mixture of experts: each token's k experts' activations
    act = tokens * (glue["d_passes"] * m.d_model + glue["ff_passes"] * ff + glue["head_passes"] * heads) * ab
    flops = tokens * (glue["d_passes"] * m.d_model + glue["ff_passes"] * ff + glue["head_passes"] * heads)
    return Op("eager_glue", True, flops=flops, act_bytes=act, launches=glue["launches"] if launches is None else launches)


def policy_eager_ops(ctx: OpContext, stack: str) -> list[Op]:
    """The policy's score path and eviction as separate eager kernels (decode step, one layer)."""
    path = policies.get(ctx.policy).eager_path(stack)
    if path is None:
        return []
    m = ctx.model
    kept = held_keys(ctx)
    elems = ctx.rows * m.n_heads * kept
    slots = ctx.rows * m.n_kv_heads * kept
    # sim.ops already charges 2 passes over the probabilities and 2 over the score state (score_update)
    # and one over the candidates (select_evict): add what the eager code does beyond that.
    score_passes = path["score_passes"] + path["step_passes"]     # the per-step draw covers every layer once
    extra_score = max(score_passes - 2, 0) * elems * SCORE_BYTES
    extra_evict = max(path["evict_passes"] - 1, 0) * slots * SCORE_BYTES
    return [Op("policy_eager_passes", True, flops=score_passes * elems, act_bytes=extra_score + extra_evict,
               launches=path["score_launches"] + path["evict_launches"] + path["step_launches"] / m.n_layers)]


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
