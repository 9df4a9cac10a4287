"""Decode attention as the serving engines' kernels run it: which kernel family, how fast it streams the KV
cache, how fast it computes. Pure numpy; shared by the engine profiles (sim.profiles.engines, through
Op.bw_scale and Op.compute_eff of attn_scores / softmax / attn_v) and by the kernel-level rows of
`../shared/data/gpu-attention-kernels.csv` that pin these terms in the fit (sim.fit_profiles).

A decode-attention kernel over B bytes of K and V (one layer, all sequences of the step) takes

    t = max(B * reread / (peak_bw * stream_eff(B)),  FLOPs / compute rate)

  stream_eff(B) = bw_max[family] * B / (B + latency * peak_bw): a kernel needs a fixed time (launch, split-KV
                  reduction, tail: `attn_latency_s`) before it streams at its family's plateau; so a small
                  step (one request, a short context) reaches a small fraction of the bandwidth.
  reread        per-head kernels on a grouped-query model read each K/V element once per query head of its
                group: 1 + (g - 1) * (1 - attn_l2_reuse), the re-reads that L2 does not serve; 1 otherwise.
  compute rate  CUDA-core families: a fraction of the fp32 peak per query head, attn_mmha_core_eff for the
                FasterTransformer-lineage per-head kernels (per-head, masked-mha), attn_core_eff times g for
                the grouped kernel (cuda-core: each K/V element used by the g query heads of its group);
                tensor-core: the device's GEMM rate (never the bound at decode).
                An FP8 KV cache: on devices with FP8 units the conversion is an instruction
                (attn_fp8_kv_eff of the rate); without them (A100) it is a software conversion of
                fp8_kv_sw_ops operations per element read, on the CUDA cores.

Families (the stack -> kernel table is data: sim/engine_profiles/stacks.yaml):
  per-head     one query head at a time over paged KV (vLLM PagedAttention, adapted from FasterTransformer's
               masked multi-head kernel)
  masked-mha   the same kernel lineage, TensorRT-LLM's masked multi-head kernel (same CUDA-core rate)
  cuda-core    a KV group's query heads together on CUDA cores (FlashInfer CUDA-core decode)
  tensor-core  the group's queries as a small GEMM on tensor cores (FlashAttention/FlashInfer tensor-core
               decode, TensorRT-LLM XQA)
"""
from __future__ import annotations

import numpy as np

FAMILIES = ("per-head", "masked-mha", "cuda-core", "tensor-core")
BW_TERM = {"per-head": "attn_bw_per_head", "masked-mha": "attn_bw_per_head", "cuda-core": "attn_bw_cuda_core",
           "tensor-core": "attn_bw_tensor_core"}
# the CUDA-core rate of each CUDA-core family, by lineage: vLLM's PagedAttention kernel is adapted from
# FasterTransformer's decoder masked multi-head attention kernel (its source file's header says so), which is
# also TensorRT-LLM's masked MHA, so the per-head and masked-mha families share one rate (pinned by the vLLM
# kernel benchmarks, the sliding-window Mistral rows and the XQA pair); FlashInfer's grouped CUDA-core kernel
# has its own
CORE_TERM = {"per-head": "attn_mmha_core_eff", "masked-mha": "attn_mmha_core_eff", "cuda-core": "attn_core_eff",
             "tensor-core": "attn_core_eff"}


def decode_kernel_bytes(ctx):
    """Bytes one layer's decode-attention kernel moves: K and V, plus the queries, outputs and new K/V it reads
    and writes (sized so, its fixed latency is paid once and the time is monotone in the cache)."""
    m = ctx.model
    return (2.0 * ctx.rows * m.n_kv_heads * ctx.past_tokens * m.head_dim * ctx.kvb
            + 2.0 * ctx.rows * ctx.new_tokens * m.head_dim * ctx.ab * (m.n_heads + m.n_kv_heads))


def reread(family: str, group: float, v: dict) -> float:
    """HBM reads of each K/V element per decode step (1: read once)."""
    if family not in ("per-head", "masked-mha") or group <= 1:
        return 1.0
    return 1.0 + (group - 1.0) * (1.0 - v["attn_l2_reuse"])


def stream_eff(family: str, kernel_bytes, peak_bw: float, v: dict):
    """Fraction of peak bandwidth the kernel streams K/V at, for `kernel_bytes` bytes of K and V."""
    b = max(kernel_bytes, 1.0) if isinstance(kernel_bytes, float) else np.maximum(np.asarray(kernel_bytes, float), 1.0)
    return v[BW_TERM[family]] * b / (b + v["attn_latency_s"] * peak_bw)


def fp8_kv_factor(hw, v: dict, family: str, group: float, tensor_core_rate: float, fp32: float):
    """Multiplier of the kernel's compute rate over a 1-byte KV cache (1 for a 16-bit one: not called)."""
    if hw.flops_dtype("fp8") == "fp8":           # FP8 units: the conversion is one instruction per pair
        return v["attn_fp8_kv_eff"]
    ops = v["fp8_kv_sw_ops"]
    if family == "tensor-core":
        # the kernel's FLOPs run on tensor cores; the conversion, once per element, on the CUDA cores: per
        # 2g FLOPs of the group, `ops` CUDA-core operations
        return min(1.0, 2.0 * group * v[CORE_TERM[family]] * fp32 / (ops * tensor_core_rate))
    return 1.0 / (1.0 + ops / 2.0)               # per element read: 2 FLOPs of attention plus the conversion


def compute_eff(family: str, group: float, v: dict, fp32: float, act_peak, kv_1byte, fp8_factor):
    """Op.compute_eff of the attention ops (a fraction of the activation dtype's peak), or None for the
    tensor-core family over a 16-bit cache (the device's own GEMM curve; NaN at the 16-bit points of a mix).
    A bool `kv_1byte` (one point): floats."""
    if isinstance(kv_1byte, bool):
        kv = fp8_factor if kv_1byte else 1.0
        if family == "tensor-core":
            return min(kv, 1.0) if kv_1byte else None
        return min(v[CORE_TERM[family]] * (group if family == "cuda-core" else 1.0) * kv * fp32 / act_peak, 1.0)
    kv = np.where(kv_1byte, fp8_factor, 1.0)
    if family == "tensor-core":
        if not np.any(kv_1byte):
            return None
        return np.where(kv_1byte, np.minimum(kv, 1.0), np.nan)
    reuse = group if family == "cuda-core" else 1.0
    return np.minimum(v[CORE_TERM[family]] * reuse * kv * fp32 / act_peak, 1.0)


def kernel_time(family: str, group: float, kv_bytes, flops, peak_bw: float, fp32: float, v: dict,
                kv_1byte: bool = False, hw=None, tensor_core_rate: float | None = None):
    """Seconds of one kernel of `kv_bytes` K/V bytes and `flops` FLOPs (the kernel-level rows)."""
    t_mem = kv_bytes * reread(family, group, v) / (peak_bw * stream_eff(family, kv_bytes, peak_bw, v))
    if family == "tensor-core" and not kv_1byte:
        return t_mem
    factor = fp8_kv_factor(hw, v, family, group, tensor_core_rate or fp32, fp32) if kv_1byte else 1.0
    if family == "tensor-core":
        return np.maximum(t_mem, flops / (tensor_core_rate * factor))
    reuse = group if family == "cuda-core" else 1.0
    return np.maximum(t_mem, flops / (v[CORE_TERM[family]] * reuse * factor * fp32))
