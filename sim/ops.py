"""The operators of one forward pass, with their FLOPs and bytes by kind (docs/sim.md has the formulas).

Every quantity is a plain expression over the `OpContext` fields, so one code path serves a single
point (Python floats) and millions of points (numpy arrays broadcast over points, decode steps and,
with a trace, layers). An `Op` is per occurrence: `per_layer` ops run once per layer, the others once
per step. Profiles (sim/profiles.py) set kernel launches and may add their own operators.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from sim.kvlen import SCORED

BYTE_FIELDS = ("weight_bytes", "act_bytes", "kv_read_bytes", "kv_write_bytes")
FIELDS = ("flops",) + BYTE_FIELDS

SOFTMAX_FLOPS = 5.0        # max, subtract, exp, sum, divide per score element
NORM_FLOPS = 5.0           # square, sum, rsqrt, scale, weight per element (+ residual add)
SCORE_BYTES = 4.0          # accumulated scores and probabilities kept in fp32
# Score update per kept score element and query head. H2O adds the attention probability to the
# accumulated score (scale + add). Keyformer also draws Gumbel noise (counter RNG ~10 ops, two logs),
# divides by the temperature and takes a second softmax over the noisy logits: ~30 ops.
SCORE_UPDATE_FLOPS = {"h2o": 2.0, "keyformer": 30.0}


@dataclass(slots=True)
class Op:
    name: str
    per_layer: bool
    flops: Any = 0.0
    weight_bytes: Any = 0.0
    act_bytes: Any = 0.0
    kv_read_bytes: Any = 0.0
    kv_write_bytes: Any = 0.0
    launches: float = 1.0
    gemm: bool = False          # True: a GEMM over the weights, at the weight dtype's peak; else at the activation dtype's
    rows: Any = None            # gemm: token rows multiplied by the weight (skinny-GEMM efficiency)
    # a GEMM over activations (attention's batched q @ K^T and p @ V), at the activation dtype's peak.
    # GEMM-class ops (gemm or matmul) get the compute-efficiency ramp; other ops run without one
    # (docs/sim.md "Operator cost")
    matmul: bool = False
    # "scores" (q @ K^T) or "values" (p @ V): streams the KV cache as a batched GEMV, which may run
    # below the weight-GEMV rate (hwmodels Device.attn_scores_factor / attn_values_factor)
    kv_stream: str | None = None
    # bytes of each tensor the op allocates anew (torch.cat / index_select / repeat_kv outputs in eager
    # code): filling fresh memory may run below the streaming rate (hwmodels Device.fresh_alloc_factor)
    fresh_tensor_bytes: Any = None
    # name of the op whose kernel this one runs inside (the nearest earlier op of that name in the
    # list): its FLOPs and bytes join that kernel's roofline, and its own row shows no time
    fused_into: str | None = None
    # an engine profile's own rates (Profile.adjust_ops): compute_eff replaces the device's size curve
    # for this op (fraction of the op's peak, e.g. decode attention on CUDA cores), compute_scale and
    # bw_scale multiply the device's compute and streaming efficiencies; all in (0, 1], None = unchanged
    compute_eff: Any = None
    compute_scale: Any = None
    bw_scale: Any = None


@dataclass(slots=True)
class OpContext:
    """What an operator needs to know about one forward pass (fields may be numpy arrays).

    rows = batch * beams sequences; each feeds `new_tokens` tokens and attends over `past_tokens`
    cached tokens per KV head (mean over rows; with a trailing layer axis when a trace gives per-layer
    lengths). `prompt` is the full prompt length for prefill-time policy ops.
    """
    model: Any
    policy: str
    phase: str                  # "prefill" or "decode"
    batch: Any
    beams: Any
    rows: Any
    new_tokens: Any
    past_tokens: Any
    cache_ratio: Any
    recent_ratio: Any
    weight_dtype: str
    kv_dtype: str
    act_dtype: str
    wb: float                   # bytes per weight element
    kvb: float                  # bytes per KV element
    ab: float                   # bytes per activation element
    profile: Any
    completes_prompt: bool = True   # prefill: this pass finishes the prompt (policy selects + compacts)
    hw: Any = None                  # the device (engine profiles read its peaks in Profile.adjust_ops)


def _adjust(ctx: OpContext, ops: list[Op]) -> list[Op]:
    """An engine profile's rates for these ops (Profile.adjust_ops sets Op.compute_eff / compute_scale /
    bw_scale in place); other profiles: unchanged."""
    hook = getattr(ctx.profile, "adjust_ops", None)
    if hook is not None:
        hook(ctx, ops)
    return ops


def _launch(ctx: OpContext, name: str) -> float:
    return ctx.profile.launches.get(name, 1.0)


def dense_ops(ctx: OpContext) -> list[Op]:
    """Embedding, norms, projections, MLP and LM head: all tokens of the pass go through the weights."""
    m, ab, wb = ctx.model, ctx.ab, ctx.wb
    d, hd = m.d_model, m.head_dim
    tokens = ctx.rows * ctx.new_tokens
    qkv_w = d * (m.n_heads + 2 * m.n_kv_heads) * hd
    out_w = m.n_heads * hd * d
    mlp_w = (3 if m.gated_mlp else 2) * d * m.d_ff
    mlp_inner = (2 if m.gated_mlp else 1) * m.d_ff      # gate+up (or up) output written, then read
    logits_rows = ctx.rows                               # fused: logits for the last position only
    return _adjust(ctx, [
        Op("embed", False, weight_bytes=tokens * d * wb, act_bytes=tokens * d * ab, launches=_launch(ctx, "embed")),
        Op("norms", True, flops=2 * NORM_FLOPS * tokens * d, weight_bytes=2 * d * wb,
           act_bytes=2 * 2 * tokens * d * ab, launches=_launch(ctx, "norms")),
        Op("qkv_proj", True, flops=2 * tokens * qkv_w, weight_bytes=qkv_w * wb,
           act_bytes=tokens * (d + (m.n_heads + 2 * m.n_kv_heads) * hd) * ab, launches=_launch(ctx, "qkv_proj"),
           gemm=True, rows=tokens),
        Op("out_proj", True, flops=2 * tokens * out_w, weight_bytes=out_w * wb,
           act_bytes=tokens * (m.n_heads * hd + d) * ab, launches=_launch(ctx, "out_proj"), gemm=True,
           rows=tokens),
        Op("mlp", True, flops=2 * tokens * mlp_w, weight_bytes=mlp_w * wb,
           act_bytes=tokens * (2 * d + mlp_inner + m.d_ff) * ab, launches=_launch(ctx, "mlp"), gemm=True, rows=tokens),
        Op("final_norm", False, flops=NORM_FLOPS * tokens * d, weight_bytes=d * wb, act_bytes=2 * tokens * d * ab,
           launches=_launch(ctx, "final_norm")),
        Op("lm_head", False, flops=2 * logits_rows * m.vocab_size * d, weight_bytes=m.vocab_size * d * wb,
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


def policy_decode_ops(ctx: OpContext) -> list[Op]:
    """Per decode step: update the accumulated score of every kept token, evict the lowest-scored one.

    Window and StreamingLLM evict by position (the new token overwrites the oldest slot): no ops.
    """
    if ctx.policy not in SCORED:
        return []
    m = ctx.model
    kept = ctx.past_tokens + 1.0                           # cached tokens plus the one just appended
    elems = ctx.rows * m.n_heads * kept                    # one probability per query head and kept key
    state = ctx.rows * m.n_kv_heads * kept                 # accumulated scores live per KV head
    candidates = ctx.rows * m.n_kv_heads * (kept - (ctx.recent_ratio * ctx.past_tokens) // 1)
    if ctx.profile.score_in_attention:
        # a by-product of the attention softmax: the kernel that holds each probability (keyformer: adds
        # the noise and takes the second softmax on chip) read-modify-writes the accumulated score vector
        update = Op("score_update", True, flops=SCORE_UPDATE_FLOPS[ctx.policy] * elems,
                    act_bytes=2 * state * SCORE_BYTES, launches=0.0, fused_into="attn_scores")
    else:
        # the attention kernel emits the probabilities (keyformer: the raw logits) once in fp32, the
        # score kernel reads them and read-modify-writes the accumulated score vector.
        update = Op("score_update", True, flops=SCORE_UPDATE_FLOPS[ctx.policy] * elems,
                    act_bytes=2 * elems * SCORE_BYTES + 2 * state * SCORE_BYTES, launches=_launch(ctx, "score_update"))
    return [
        update,
        # one small kernel per layer: the lowest accumulated score outside the recent window
        Op("select_evict", True, flops=candidates, act_bytes=candidates * SCORE_BYTES,
           launches=_launch(ctx, "select_evict")),
    ]


def policy_prefill_ops(ctx: OpContext) -> list[Op]:
    """After the prompt: score every prompt token, pick top-(k-w) plus the recent w, gather k of n."""
    if ctx.policy not in SCORED:
        return []
    m, ab, kvb = ctx.model, ctx.ab, ctx.kvb
    hd, h, hkv = m.head_dim, m.n_heads, m.n_kv_heads
    rows, q, past = ctx.rows, ctx.new_tokens, ctx.past_tokens
    n = past + q
    score_elems = rows * h * q * (past + (q + 1) * 0.5)
    # A flash kernel does not keep the probabilities: recompute the logits (2*hd FLOPs each) and
    # column-sum the (noisy) softmax into one score per kept token and KV head.
    # (The column sums need each row's softmax normaliser, known only once the row is done: a second
    # pass, also under the fused profile; it recomputes q @ K^T, so it is GEMM-class.)
    ops = [Op("score_update", True, flops=score_elems * (2 * hd + SOFTMAX_FLOPS + SCORE_UPDATE_FLOPS[ctx.policy]),
              act_bytes=rows * q * (h + hkv) * hd * ab + rows * hkv * n * SCORE_BYTES,
              launches=_launch(ctx, "score_update"), matmul=True)]
    if not ctx.completes_prompt:
        return ops
    k = np.maximum(np.floor(ctx.cache_ratio * n), 1.0)
    w = np.floor(ctx.recent_ratio * k)
    candidates = rows * hkv * np.maximum(n - w, 1.0)
    ops += [
        Op("select_topk", True, flops=candidates * np.log2(np.maximum(k - w, 2.0)), act_bytes=candidates * SCORE_BYTES,
           launches=_launch(ctx, "select_topk")),
        Op("compact", True, act_bytes=2 * rows * hkv * k * SCORE_BYTES,
           kv_read_bytes=2 * rows * hkv * k * hd * kvb, kv_write_bytes=2 * rows * hkv * k * hd * kvb,
           launches=_launch(ctx, "compact")),
    ]
    return ops


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
