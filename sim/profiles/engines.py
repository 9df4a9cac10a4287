"""What the GPU serving-engine profiles (`trtllm`, `trtllm-pytorch`, `vllm`, `vllm-v0`) share: fused operators
plus a few named, bounded, fitted physical terms.

The operators are the fused profile's (sim/profiles/fused.py: one flash-attention kernel per layer, fused
gate+up MLP, logits for the last position only). What an engine adds are its own rates and overheads, each a
named term with physical bounds (TERMS below). The *values* are data, not code: they live in
sim/engine_profiles/gpu-published-fit.yaml, written by `python -m sim.fit_profiles` from the published
measurements (both training CSVs and the kernel-level decode-attention file, fitted jointly), with the fit
command, the files' hashes, the date and each term's value and provenance.

How each term enters (docs/sim.md "Engine profiles"):
  - step_overhead_s, launch_overhead_s   TensorRT-LLM's C++ runtime (classic): per step (sampling, scheduling,
                         host syncs) and per kernel launch (the gap between kernels in the stream);
                         context_overhead_s: per context (prefill) pass on top (the new requests' setup).
  - the PyTorch backend (TensorRT-LLM 0.20+): decode steps replay CUDA graphs and the overlap scheduler
                         hides host work (pytorch_runtime below: derived, not fitted).
  - vllm_v0_step_s, vllm_v0_seq_s; vllm_v1_step_s, vllm_v1_seq_s   vLLM's host work per step and per
                         running sequence (Python scheduler, sampler, detokeniser), exposed on the step's
                         critical path in the V0 engine, mostly overlapped in V1 (async scheduling); CUDA
                         graphs for decode in both (kernel gap PYTORCH_RUNTIME_KERNEL_GAP_S).
  - gemm_eff, fp8_gemm_eff   fraction of the device's GEMM efficiency curve the weight GEMMs reach, and the
                         further fraction of FP8 (1-byte) weight GEMMs.
  - decode attention (sim/profiles/attention.py): the kernel family each stack runs (stacks.yaml), its
                         streaming plateau (attn_bw_per_head / _cuda_core / _tensor_core), a per-kernel fixed
                         time (attn_latency_s), the L2 share of a per-head kernel's re-reads on a grouped-query
                         model (attn_l2_reuse), the CUDA-core rates (attn_core_eff; attn_mmha_core_eff for
                         the FasterTransformer-lineage per-head kernels), FP8-KV conversion on FP8 units
                         (attn_fp8_kv_eff) and in software without them (fp8_kv_sw_ops: not fitted, no
                         row measures it).
The decode-attention rate enters as Op.bw_scale and Op.compute_eff of attn_scores / softmax / attn_v; the
streaming efficiency stays <= 1 of peak bandwidth, so every step still respects the floor
(weights + KV bytes) / peak bandwidth.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import yaml

from sim.op import Op
from sim.profiles import attention as attn
from sim.profiles.base import DECODE_ATTENTION_OPS, PROFILES, Profile, read_fit_yaml, register_profile

SHIPPED_FIT_FILE = Path(__file__).resolve().parents[1] / "engine_profiles" / "gpu-published-fit.yaml"
# KVSIM_ENGINE_PROFILES: a profile file of the user's (e.g. sim.fit_profiles --measured-run's) in place of the shipped one
FIT_FILE = Path(os.environ["KVSIM_ENGINE_PROFILES"]).expanduser() if os.environ.get("KVSIM_ENGINE_PROFILES") \
    else SHIPPED_FIT_FILE
STACKS_FILE = Path(__file__).resolve().parents[1] / "engine_profiles" / "stacks.yaml"
ENGINES = ("trtllm", "vllm")
RUNTIMES = ("classic", "pytorch", "vllm-v0", "vllm-v1")
DEFAULT_RUNTIME = {"trtllm": "classic", "vllm": "vllm-v1"}
# the host terms each runtime's profile is built from (make_profile: the PyTorch backend then hides the step
# term and caps the launch term at the CUDA-graph gap; vLLM's are per step and per running sequence)
RUNTIME_HOST_TERMS = {"classic": ("step_overhead_s", "launch_overhead_s", "context_overhead_s"),
                      "pytorch": ("step_overhead_s", "launch_overhead_s"),
                      "vllm-v0": ("vllm_v0_step_s", "vllm_v0_seq_s"), "vllm-v1": ("vllm_v1_step_s", "vllm_v1_seq_s")}


@dataclass(frozen=True)
class Term:
    name: str
    unit: str
    lo: float
    hi: float
    prior: float
    prior_source: str
    meaning: str
    fitted: bool = True       # False: no training row measures it; it stays at its prior (physics, sourced)


_VLLM_BLOG = ("vLLM blog on v0.6.0 (Sept 2024): in v0.5.3, for Llama-3-8B on one H100 under load, the API server took "
              "33% and scheduling 29% of the time, so host work was ~1.6x the GPU's; with a ~10 ms GPU step at ~100 "
              "running sequences (an assumption) that is ~16 ms, split here as 4 ms per step + 0.12 ms per sequence")
# Bounds are physical ranges, not tuning room; priors are what the project assumed before any fit.
TERMS = (
    Term("step_overhead_s", "s", 0.0, 0.010, 1e-3,
         "device files' host_overhead assumption (1 ms per step, hwmodels/devices/*.yaml)",
         "TensorRT-LLM C++ runtime: per-step time outside the kernels (sampling, scheduling, host syncs)"),
    Term("context_overhead_s", "s", 0.0, 0.010, 0.0,
         "none assumed before this term existed (the step and launch terms were all the runtime's host time)",
         "TensorRT-LLM C++ runtime: fixed time of a context (prefill) pass on top of the step's: preparing the "
         "new requests' inputs and KV blocks before the kernels run, and the first token's return"),
    Term("launch_overhead_s", "s", 0.5e-6, 8e-6, 4e-6,
         "device files' launch_overhead assumption (4 us, hwmodels/devices/*.yaml); bounds: a CUDA launch "
         "gap is 1-5 us typically",
         "TensorRT-LLM C++ runtime: per kernel launch in the stream"),
    Term("vllm_v0_step_s", "s", 0.0, 0.020, 4e-3, _VLLM_BLOG,
         "vLLM V0 engine: host time per step on the critical path (scheduler, sampler, detokeniser)"),
    Term("vllm_v0_seq_s", "s", 0.0, 1e-3, 1.2e-4, _VLLM_BLOG,
         "vLLM V0 engine: host time per running sequence per step"),
    Term("vllm_v1_step_s", "s", 0.0, 0.010, 5e-4,
         "vLLM V1 engine with async scheduling: the host work of step n+1 overlaps step n (assumed 0.5 ms left)",
         "vLLM V1 engine: exposed host time per step"),
    Term("vllm_v1_seq_s", "s", 0.0, 2e-4, 2e-6, "assumption: a few us per sequence left exposed",
         "vLLM V1 engine: exposed host time per running sequence per step"),
    Term("runtime_reserve_gb", "GB", 0.0, 4.0, 1.0,
         "assumption: the CUDA context (~0.5 GB) and library workspaces (cuBLAS/cuBLASLt, NCCL, sampling) take "
         "about 1 GB; bound: a few GB. The buffers that grow with the model (activations of max_num_tokens "
         "tokens, logits of the largest batch) are derived, not in this term: "
         "sim.validation.published_gpu.engine_buffers",
         "device memory the engine holds outside the weights, its model-sized buffers and the KV pool "
         "(capacity-limited rows only)"),
    Term("attn_prefill_eff", "fraction", 0.3, 1.0, 1.0,
         "fused profile: prefill attention at the device's matmul curve like a weight GEMM",
         "prefill (flash-attention forward) q @ K^T and p @ V reach this fraction of the device's matmul rate "
         "(softmax, masking and the causal tile skew cost more than a GEMM's epilogue)"),
    Term("gemm_eff", "fraction", 0.5, 1.0, 1.0,
         "fused profile: the device's GEMM efficiency curve as is",
         "fraction of the device's GEMM efficiency the engine's weight GEMMs reach (prefill MFU)"),
    Term("fp8_gemm_eff", "fraction", 0.3, 1.0, 1.0,
         "fused profile: FP8 GEMMs at the FP8 peak like any dtype",
         "further fraction reached by FP8 (1-byte) weight GEMMs"),
    Term("attn_bw_per_head", "fraction of peak bandwidth", 0.3, 1.0, 0.8,
         "device files' streaming plateau (0.8)",
         "decode attention, per-head kernel: streaming plateau"),
    Term("attn_bw_cuda_core", "fraction of peak bandwidth", 0.2, 1.0, 0.8,
         "device files' streaming plateau (0.8)",
         "decode attention, grouped CUDA-core kernel: streaming plateau"),
    Term("attn_bw_tensor_core", "fraction of peak bandwidth", 0.3, 1.0, 0.8,
         "device files' streaming plateau (0.8)",
         "decode attention, tensor-core kernel: streaming plateau"),
    Term("attn_latency_s", "s", 0.5e-6, 60e-6, 0.5e-6,
         "device files' streaming ramp (0.5 us x bandwidth); bounds: a kernel launch to a split-KV reduction and "
         "its tail, tens of us at most",
         "decode attention: fixed time per kernel before it streams at its plateau"),
    Term("attn_l2_reuse", "fraction", 0.0, 0.95, 0.0,
         "every re-read from HBM",
         "per-head kernel on a grouped-query model: share of the g - 1 re-reads of each K/V element served by L2"),
    Term("attn_core_eff", "fraction of fp32 peak", 0.02, 1.0, 1.0,
         "no prior measurement; upper bound 1 = the fp32 CUDA-core peak",
         "decode attention, grouped CUDA-core kernel (FlashInfer): FLOP rate per query head as a fraction of the "
         "fp32 peak"),
    Term("attn_mmha_core_eff", "fraction of fp32 peak", 0.02, 1.0, 1.0,
         "no prior measurement; upper bound 1 = the fp32 CUDA-core peak",
         "FasterTransformer-lineage per-head decode kernels (TensorRT-LLM's masked multi-head attention; vLLM's "
         "PagedAttention, adapted from it): FLOP rate per query head as a fraction of the fp32 peak"),
    Term("attn_fp8_kv_eff", "fraction", 0.3, 1.0, 1.0,
         "1 = converting FP8 KV costs nothing on FP8 units",
         "CUDA-core decode attention over an FP8 KV cache on a device with FP8 units, relative to 16-bit KV"),
    Term("fp8_kv_sw_ops", "operations per element", 1.0, 32.0, 8.0,
         "assumption: e4m3 -> fp16 without FP8 units takes shifts, masks and an add per element (~8 operations); "
         "not fitted: no training row runs an FP8 KV cache on an A100",
         "software FP8-KV conversion cost per element read on devices without FP8 units", fitted=False),
)
TERM_NAMES = tuple(t.name for t in TERMS)
TERMS_BY_NAME = {t.name: t for t in TERMS}
FITTED_TERMS = tuple(t for t in TERMS if t.fitted)


def prior_values() -> dict[str, float]:
    return {t.name: t.prior for t in TERMS}


def check_values(values: dict, where: str, terms=TERMS) -> dict[str, float]:
    """Every term of `terms` (default: the engine terms) present, finite and inside its bounds; one-line
    ValueError otherwise."""
    missing = [t.name for t in terms if t.name not in values]
    if missing:
        raise ValueError(f"{where}: missing terms {missing}")
    out = {}
    for t in terms:
        v = values[t.name]
        v = v["value"] if isinstance(v, dict) else v
        try:
            v = float(v)
        except (TypeError, ValueError):
            raise ValueError(f"{where}: term {t.name} is not a number: {v!r}") from None
        if not (t.lo - 1e-12 <= v <= t.hi + 1e-12):
            raise ValueError(f"{where}: term {t.name} = {v:g} outside its bounds [{t.lo:g}, {t.hi:g}]")
        out[t.name] = v
    return out


@lru_cache(maxsize=None)
def kernel_table() -> dict:
    """engine -> {mha, gqa, kv_1byte} decode-attention families (stacks.yaml `kernels`)."""
    data = yaml.safe_load(STACKS_FILE.read_text())
    return {k: dict(v) for k, v in data["kernels"].items()}


@dataclass(frozen=True)
class Kernels:
    """Which decode-attention family an engine profile runs: the engine's table, and a stack's overrides
    (a kernel for every model, or one for sliding-window models)."""
    engine: str
    decode_kernel: str | None = None
    sliding_window_kernel: str | None = None

    def family(self, model, kv_1byte: bool) -> str:
        if self.decode_kernel is not None:
            return self.decode_kernel
        if self.sliding_window_kernel is not None and getattr(model, "sliding_window", None) is not None:
            return self.sliding_window_kernel
        table = kernel_table().get(self.engine, kernel_table()["trtllm"])
        if kv_1byte and table.get("kv_1byte"):
            return table["kv_1byte"]
        return table["mha"] if model.n_heads == model.n_kv_heads else table["gqa"]


def decode_attention_kernel(model, engine: str = "trtllm", kv_1byte: bool = False) -> str:
    """The family `engine` runs for `model`'s decode attention (stacks.yaml)."""
    return Kernels(engine).family(model, kv_1byte)


def _act_peak(hw, ab):
    """Peak FLOP/s of the activation dtype (fp32 for 4-byte activations, else bf16): a float, or per point."""
    if isinstance(ab, (int, float)):
        return float(hw.peak_flops("fp32" if ab >= 4.0 else "bf16"))
    return np.where(np.asarray(ab, float) >= 4.0, float(hw.peak_flops("fp32")), float(hw.peak_flops("bf16")))


def _attention_rates(ctx, v: dict, family: str, kv_1byte):
    """(bw_scale, compute_eff) of the decode-attention ops under `family` (floats for one point, else arrays
    over points)."""
    m, hw = ctx.model, ctx.hw
    group = m.n_heads / m.n_kv_heads
    peak_bw = float(hw.memory_bw)
    # the kernel's bytes as the engine sizes it (sim.opcost: the host op and the ops fused into it)
    kernel_bytes = attn.decode_kernel_bytes(ctx)
    # the family's streaming efficiency in place of the device curve: bw_scale = eff / device eff, so the
    # op streams at eff of peak (at most 1: the bandwidth floor holds). One point (the DES's step): the same
    # operations on floats, without numpy's per-call cost
    if isinstance(kernel_bytes, float):
        kernel_bytes = max(kernel_bytes, 1.0)
        eff = min(attn.stream_eff(family, kernel_bytes, peak_bw, v), 1.0)
        device_eff = float(hw.bw_efficiency(kernel_bytes))
    else:
        kernel_bytes = np.maximum(kernel_bytes, 1.0)
        eff = np.minimum(attn.stream_eff(family, kernel_bytes, peak_bw, v), 1.0)
        device_eff = np.asarray(hw.bw_efficiency(np.atleast_1d(kernel_bytes)), float).reshape(np.shape(kernel_bytes))
    bw_scale = eff / device_eff / attn.reread(family, group, v)
    fp32, bf16 = float(hw.peak_flops("fp32")), float(hw.peak_flops("bf16"))
    fp8 = kv_1byte if isinstance(kv_1byte, bool) else np.any(kv_1byte)
    factor = attn.fp8_kv_factor(hw, v, family, group, bf16, fp32) if fp8 else 1.0
    return bw_scale, attn.compute_eff(family, group, v, fp32, _act_peak(hw, ctx.ab), kv_1byte, factor)


def _plain(x):
    """A 0-d value as a float (the engine's scalar path), arrays and None as they are."""
    return x if x is None or isinstance(x, float) or np.ndim(x) else float(x)


def _adjuster(v: dict, kernels: Kernels):
    gemm, fp8 = v["gemm_eff"], v["fp8_gemm_eff"]

    def adjust_ops(ctx, ops):
        # FP8 GEMMs: the fp8 weight dtype (per point when the points mix dtypes: 1-byte weights)
        if ctx.weight_dtype != "mixed":
            gemm_scale = gemm * (fp8 if ctx.weight_dtype == "fp8" else 1.0)
        else:
            gemm_scale = gemm * np.where(np.asarray(ctx.wb, float) == 1.0, fp8, 1.0)
        decode_attention = ctx.phase == "decode" and ctx.hw is not None and hasattr(ctx.hw, "peak_flops")
        bw_scale = c_eff = None
        if decode_attention and isinstance(ctx.kvb, (int, float)):   # one KV dtype: one kernel (the DES's case)
            kv_1byte = ctx.kvb <= 1.0
            bw_scale, c_eff = _attention_rates(ctx, v, kernels.family(ctx.model, kv_1byte), kv_1byte)
        elif decode_attention:
            kv_1byte = np.asarray(ctx.kvb, float) <= 1.0
            families = {kernels.family(ctx.model, bool(flag)) for flag in np.unique(kv_1byte)}
            if len(families) == 1:
                bw_scale, c_eff = _attention_rates(ctx, v, families.pop(), kv_1byte)
            else:   # points mixing 1- and 2-byte KV run different kernels (NaN: the device's own rate)
                one = _attention_rates(ctx, v, kernels.family(ctx.model, True), kv_1byte)
                two = _attention_rates(ctx, v, kernels.family(ctx.model, False), kv_1byte)
                bw_scale = np.where(kv_1byte, one[0], two[0])
                c_eff = np.where(kv_1byte, np.nan if one[1] is None else one[1],
                                 np.nan if two[1] is None else two[1])
        gemm_scale, bw_scale, c_eff = _plain(gemm_scale), _plain(bw_scale), _plain(c_eff)
        prefill = ctx.phase == "prefill"
        for op in ops:
            if op.gemm:
                op.compute_scale = gemm_scale
            elif prefill and (op.name == "attn_scores" or op.name == "attn_v"):
                op.compute_scale = v["attn_prefill_eff"]
            elif decode_attention and op.name in DECODE_ATTENTION_OPS:
                op.bw_scale = bw_scale
                if c_eff is not None:
                    op.compute_eff = c_eff
    return adjust_ops


def _host_op(name: str, seconds: float, per_sequence: bool):
    """An extra_*_ops hook: host time as an operator row (so breakdowns show it), one 'FLOP' per running
    sequence (`per_sequence`: vLLM's per-sequence work of a decode step) or per pass (the classic TensorRT-LLM
    runtime's context setup, once per step however many prefill chunks it holds) at a rate of one per
    `seconds` of the op's peak (the activation dtype's, per point when the points mix dtypes)."""
    def ops(ctx):
        if ctx.hw is None or not hasattr(ctx.hw, "peak_flops"):
            return []
        return [Op(name, False, flops=ctx.rows if per_sequence else 1.0, launches=0.0,
                   compute_eff=1.0 / (seconds * _act_peak(ctx.hw, ctx.ab)), once_per_step=not per_sequence)]
    return ops


# CUDA-graph replay (TensorRT-LLM's PyTorch backend, vLLM's decode): a kernel pays only the GPU-side gap
# between kernels, not a host launch; an assumption (about 1 us between graph-replayed kernels), not fitted.
PYTORCH_RUNTIME_KERNEL_GAP_S = 1e-6
_RUNTIME_VARIANTS: dict = {}


def pytorch_runtime(profile: Profile) -> Profile:
    """`profile` as TensorRT-LLM's PyTorch backend runs it: per-kernel cost at most the graph-replay gap,
    no exposed per-step host overhead (cached per profile object)."""
    hit = _RUNTIME_VARIANTS.get(id(profile))
    if hit is not None and hit[0] is profile:
        return hit[1]
    launch = profile.launch_overhead_s if profile.launch_overhead_s is not None else PYTORCH_RUNTIME_KERNEL_GAP_S
    variant = dataclasses.replace(profile, name=f"{profile.name}-pytorch",
                                  description=profile.description + "; PyTorch-backend runtime (CUDA graphs, overlap "
                                  "scheduler: sim/profiles/engines.py pytorch_runtime)",
                                  launch_overhead_s=min(launch, PYTORCH_RUNTIME_KERNEL_GAP_S), host_overhead_s=0.0,
                                  extra_prefill_ops=None)   # the classic runtime's context_setup: hidden too
    _RUNTIME_VARIANTS[id(profile)] = (profile, variant)
    return variant


FUSED_LAUNCHES = {"embed": 1, "norms": 2, "qkv_proj": 1, "kv_write": 1, "attn_scores": 1, "softmax": 0,
                  "attn_v": 0, "out_proj": 1, "mlp": 2, "final_norm": 1, "lm_head": 1, "score_update": 1,
                  "select_evict": 1, "select_topk": 1, "compact": 1}

DESCRIPTIONS = {
    "trtllm": "NVIDIA TensorRT-LLM's C++ runtime (fused kernels as `fused`; XQA tensor-core decode for GQA, masked "
              "MHA for MHA) with fitted step and launch overheads, GEMM/FP8 GEMM efficiency and decode-attention "
              "kernel terms (sim/profiles/engines.py; values in sim/engine_profiles/gpu-published-fit.yaml)",
    "vllm": "vLLM's V1 engine (fused kernels as `fused`; FlashAttention decode, the paged per-head kernel for FP8 KV) "
            "with the same fitted kernel terms and its own host terms; values in "
            "sim/engine_profiles/gpu-published-fit.yaml",
}


def make_profile(engine: str, values: dict, name: str | None = None, runtime: str | None = None,
                 kernels: Kernels | None = None) -> Profile:
    """A Profile for `engine` under `runtime` (default: the engine's) with term values (unregistered: the fit
    builds many of these)."""
    v = check_values(values, f"profile {name or engine}")
    runtime = runtime or DEFAULT_RUNTIME.get(engine, "classic")
    if runtime not in RUNTIMES:
        raise ValueError(f"unknown runtime {runtime!r}; runtimes: {', '.join(RUNTIMES)}")
    kernels = kernels or Kernels(engine)
    host, launch, per_seq = v["step_overhead_s"], v["launch_overhead_s"], 0.0
    context = v["context_overhead_s"] if runtime == "classic" else 0.0
    if runtime in ("vllm-v0", "vllm-v1"):
        step, seq = RUNTIME_HOST_TERMS[runtime]
        host, launch, per_seq = v[step], PYTORCH_RUNTIME_KERNEL_GAP_S, v[seq]
    description = DESCRIPTIONS.get(engine, engine) + ("" if runtime == DEFAULT_RUNTIME.get(engine) else
                                                      f"; runtime {runtime}")
    profile = Profile(name=name or engine, description=description, launches=FUSED_LAUNCHES,
                      host_overhead_s=host, launch_overhead_s=launch, adjust_ops=_adjuster(v, kernels),
                      extra_decode_ops=_host_op("host_per_seq", per_seq, True) if per_seq > 0 else None,
                      extra_prefill_ops=_host_op("context_setup", context, False) if context > 0 else None,
                      engine=engine,
                      terms=tuple(sorted(v.items())))
    return pytorch_runtime(profile) if runtime == "pytorch" else profile


def read_fit_file(path: Path | str = FIT_FILE) -> dict:
    data = read_fit_yaml(path, "engine profile file", "python -m sim.fit_profiles")
    if not isinstance(data.get("engines"), dict):
        raise ValueError(f"{path}: expected a mapping with an 'engines' section")
    return data


def engine_values(data: dict, engine: str, path="engine profile file") -> dict[str, float]:
    entry = data["engines"].get(engine)
    if not isinstance(entry, dict) or not isinstance(entry.get("terms"), dict):
        raise ValueError(f"{path}: engine {engine!r} has no 'terms' mapping")
    return check_values(entry["terms"], f"{path}: {engine}")


def _file_values(engine: str) -> dict[str, float] | None:
    """The fit file's values for `engine` (priors before the first fit); None: the file has no such engine."""
    if not FIT_FILE.is_file():
        return prior_values()
    data = read_fit_file(FIT_FILE)
    if engine not in data["engines"]:
        return None
    return engine_values(data, engine, FIT_FILE)


def register_engine(engine: str, name: str | None = None, runtime: str | None = None) -> Profile | None:
    """Register `engine`'s profile (as `name`, under `runtime`) with the fit file's values; before the first
    fit (no file), with the priors, so the name exists. None: the file has no such engine."""
    values = _file_values(engine)
    if values is None:
        return PROFILES.get(name or engine)
    profile = make_profile(engine, values, runtime=runtime)
    return register_profile(dataclasses.replace(profile, name=name or engine))


def register_pytorch_runtime() -> Profile | None:
    """`trtllm-pytorch`: the trtllm profile (the fit file's terms) under the PyTorch-backend runtime."""
    return register_engine("trtllm", name="trtllm-pytorch", runtime="pytorch")
