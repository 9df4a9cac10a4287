"""The operators of one forward pass, with their FLOPs and bytes by kind (docs/sim.md has the formulas).

Every quantity is a plain expression over the `OpContext` fields, so one code path serves a single
point (Python floats) and millions of points (numpy arrays broadcast over points, decode steps and,
with a trace, layers). An `Op` is per occurrence: `per_layer` ops run once per layer, the others once
per step. Profiles (sim/profiles/) set kernel launches and may add their own operators.
"""
from __future__ import annotations

from sim import policies
from sim.models import unquantised_bytes
from sim.op import BYTE_FIELDS, FIELDS, NORM_FLOPS, SCORE_BYTES, SOFTMAX_FLOPS, Op, OpContext  # noqa: F401 (re-exported)
from sim.op import adjust as _adjust
from sim.op import launch_count as _launch

# A fused MoE layer's kernels beyond its expert GEMMs (TensorRT-LLM's and vLLM's fused-MoE paths): router
# GEMM, top-k softmax, token permute (gather to experts), unpermute (scatter and weighted sum back).
MOE_LAUNCHES = 4


def dense_ops(ctx: OpContext) -> list[Op]:
    """Embedding, norms, projections, MLP and LM head: all tokens of the pass go through the weights."""
    m, ab, wb = ctx.model, ctx.ab, ctx.wb
    hb = unquantised_bytes(wb)          # embedding, norms and LM head: 16-bit in a weight-quantised checkpoint
    d, hd = m.d_model, m.head_dim
    tokens = ctx.rows * ctx.new_tokens
    qkv_w = d * (m.n_heads + 2 * m.n_kv_heads) * hd
    out_w = m.n_heads * hd * d
    expert_w = m.expert_params()
    mlp_inner = (2 if m.gated_mlp else 1) * m.d_ff      # gate+up (or up) output written, then read
    # mixture of experts: each token runs k experts; the pass reads only the experts its tokens reach
    # (ModelSpec.experts_touched), each expert GEMM gets tokens x k / touched rows; the router (d x E) and
    # the fused-MoE path's routing kernels (MOE_LAUNCHES) come on top. Dense: k = touched = 1, no router.
    k = m.experts_per_token
    touched = m.experts_touched(tokens)
    moe_extra = MOE_LAUNCHES if m.moe else 0
    logits_rows = ctx.rows                               # fused: logits for the last position only
    in_out = m.weights_in_out                            # Conv1D projections (GPT-2); the LM head is a Linear
    return _adjust(ctx, [
        Op("embed", False, weight_bytes=tokens * d * hb, act_bytes=tokens * d * ab, launches=_launch(ctx, "embed")),
        Op("norms", True, flops=2 * NORM_FLOPS * tokens * d, weight_bytes=2 * d * hb,
           act_bytes=2 * 2 * tokens * d * ab, launches=_launch(ctx, "norms")),
        Op("qkv_proj", True, flops=2 * tokens * qkv_w, weight_bytes=qkv_w * wb,
           act_bytes=tokens * (d + (m.n_heads + 2 * m.n_kv_heads) * hd) * ab, launches=_launch(ctx, "qkv_proj"),
           gemm=True, rows=tokens, weights_in_out=in_out),
        Op("out_proj", True, flops=2 * tokens * out_w, weight_bytes=out_w * wb,
           act_bytes=tokens * (m.n_heads * hd + d) * ab, launches=_launch(ctx, "out_proj"), gemm=True,
           rows=tokens, weights_in_out=in_out),
        Op("mlp", True, flops=2 * tokens * (k * expert_w + m.router_params()),
           weight_bytes=(touched * expert_w + m.router_params()) * wb,
           act_bytes=tokens * (2 * d + k * (mlp_inner + m.d_ff) + (2 * k * d if m.moe else 0)) * ab,
           launches=_launch(ctx, "mlp") + moe_extra, gemm=True, rows=tokens * k / touched, weights_in_out=in_out),
        Op("final_norm", False, flops=NORM_FLOPS * tokens * d, weight_bytes=d * hb, act_bytes=2 * tokens * d * ab,
           launches=_launch(ctx, "final_norm")),
        Op("lm_head", False, flops=2 * logits_rows * m.vocab_size * d, weight_bytes=m.vocab_size * d * hb,
           act_bytes=logits_rows * (d * ab + m.vocab_size * SCORE_BYTES), launches=_launch(ctx, "lm_head"), gemm=True,
           rows=logits_rows),
    ])


def attention_ops(ctx: OpContext) -> list[Op]:
    """KV write, QK^T, softmax, attention x V for `rows` sequences (causal within the new tokens)."""
    m, ab, kvb = ctx.model, ctx.ab, ctx.kvb
    hd, h, hkv = m.head_dim, m.n_heads, m.n_kv_heads
    rows, q, past = ctx.rows, ctx.new_tokens, ctx.past_tokens
    keys_per_query = past + (q + 1) * 0.5                 # mean keys attended per query (causal)
    score_elems = rows * h * q * keys_per_query
    # An eager stack writes the score matrix, softmax reads and rewrites it, attn x V reads it;
    # a fused (flash) kernel keeps it on chip.
    # The flash kernel is one kernel: softmax and attn x V run inside attn_scores' kernel.
    mat = ab if ctx.profile.materialise_scores else 0.0
    inside = None if ctx.profile.materialise_scores else "attn_scores"
    new_kv = rows * q * hkv * hd
    return [
        Op("kv_write", True, act_bytes=2 * new_kv * ab, kv_write_bytes=2 * new_kv * kvb,
           launches=_launch(ctx, "kv_write")),
        Op("attn_scores", True, flops=2 * score_elems * hd,
           act_bytes=rows * q * h * hd * ab + new_kv * ab + score_elems * mat,
           kv_read_bytes=rows * hkv * past * hd * kvb, launches=_launch(ctx, "attn_scores"), kv_stream="scores",
           matmul=True),
        Op("softmax", True, flops=SOFTMAX_FLOPS * score_elems, act_bytes=2 * score_elems * mat,
           launches=_launch(ctx, "softmax"), fused_into=inside),
        Op("attn_v", True, flops=2 * score_elems * hd,
           act_bytes=new_kv * ab + rows * q * h * hd * ab + score_elems * mat,
           kv_read_bytes=rows * hkv * past * hd * kvb, launches=_launch(ctx, "attn_v"), kv_stream="values",
           matmul=True, fused_into=inside),
    ]


def once_per_step(ops: list[Op]) -> list[Op]:
    """A mixed step's ops with each Op.once_per_step operator kept at its first occurrence only."""
    if not any(op.once_per_step for op in ops):
        return ops
    seen, out = set(), []
    for op in ops:
        if op.once_per_step:
            if op.name in seen:
                continue
            seen.add(op.name)
        out.append(op)
    return out


def policy_decode_ops(ctx: OpContext) -> list[Op]:
    """The policy's own operators of a decode step (sim.policies: score update, eviction)."""
    return policies.get(ctx.policy).decode_ops(ctx)


def policy_prefill_ops(ctx: OpContext) -> list[Op]:
    """The policy's own operators after a prompt (sim.policies: scoring, selection, compaction)."""
    return policies.get(ctx.policy).prefill_ops(ctx)


def forward_ops(ctx: OpContext) -> list[Op]:
    """All operators of a pass over one group of sequences: dense, then the group's own."""
    return dense_ops(ctx) + group_ops(ctx)


def group_ops(ctx: OpContext) -> list[Op]:
    """Operators that depend on a group's KV state: attention, the policy's own, the profile's extras.

    A mixed step (decodes + prefill chunks) runs dense_ops once over all tokens and group_ops per group.
    """
    ops = attention_ops(ctx)
    if ctx.phase == "decode":
        ops += policy_decode_ops(ctx)
        hook = ctx.profile.extra_decode_ops
    else:
        ops += policy_prefill_ops(ctx)
        hook = ctx.profile.extra_prefill_ops
    if hook is not None:
        ops += list(hook(ctx))
    return _adjust(ctx, ops)
