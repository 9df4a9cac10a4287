"""One operator row (`Op`) and what an operator needs to know about its pass (`OpContext`).

The vocabulary shared by the core operators (sim.ops), the policies' own operators (sim.policies) and
the profiles' extra operators (sim.profiles): a module of its own so each of them can build rows without
importing the others.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

BYTE_FIELDS = ("weight_bytes", "act_bytes", "kv_read_bytes", "kv_write_bytes")
FIELDS = ("flops",) + BYTE_FIELDS

SOFTMAX_FLOPS = 5.0        # max, subtract, exp, sum, divide per score element
NORM_FLOPS = 5.0           # square, sum, rsqrt, scale, weight per element (+ residual add)
SCORE_BYTES = 4.0          # accumulated scores and probabilities kept in fp32


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
    weights_in_out: bool = False  # gemm: weights stored [in, out], applied as x @ W (Conv1D's skinny table)
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
    # a step runs it once however many of its groups (requests' prefill chunks, the decodes) add it, e.g. the
    # classic TensorRT-LLM runtime's context setup, per context pass (sim.ops.once_per_step)
    once_per_step: bool = False


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


def adjust(ctx: OpContext, ops: list[Op]) -> list[Op]:
    """An engine profile's rates for these ops (Profile.adjust_ops sets Op.compute_eff / compute_scale /
    bw_scale in place); other profiles: unchanged."""
    if ctx.profile.adjust_ops is not None:
        ctx.profile.adjust_ops(ctx, ops)
    return ops


def launch_count(ctx: OpContext, name: str) -> float:
    return ctx.profile.launches.get(name, 1.0)
