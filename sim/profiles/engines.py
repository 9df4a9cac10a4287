"""What the GPU serving-engine profiles (`trtllm`, `vllm`: sim/profiles/trtllm.py, vllm.py) share: fused
operators plus a few named, fitted rates.

The operators are the fused profile's (sim/profiles/fused.py: one flash-attention kernel per layer, fused
gate+up MLP, logits for the last position only). What an engine adds are its own rates and overheads,
each a named term with physical bounds (TERMS below). The *values* are data, not code: they live in
sim/engine_profiles/gpu-published-fit.yaml, written by `python -m sim.fit_profiles` from a CSV of
published measurements, with the fit command, the CSV's hash, the date and each term's value and
provenance. Each engine's module reads that file when it is imported (first lookup of `trtllm` or `vllm`).

How each term enters (docs/sim.md "Engine profiles"):
  - step_overhead_s      per step (prefill or decode): sampling, scheduling, host syncs; replaces the
                         device file's host_overhead_s (an assumption of 1 ms there).
  - launch_overhead_s    per kernel launch (the gap between kernels in the stream); replaces the
                         device file's launch_overhead_s (an assumption of 4 us there).
  - gemm_eff             the engine's weight GEMMs reach this fraction of the device's GEMM efficiency
                         curve (prefill MFU: large GEMMs are compute-bound).
  - fp8_gemm_eff         FP8 weight GEMMs reach this further fraction (scaling and
                         conversion work of FP8 GEMMs; FP8 peak is twice the 16-bit peak on paper).
  - attn_core_eff        decode attention (one query token against the cache: batched GEMVs) runs on
                         the CUDA cores, not the tensor cores: its FLOP rate is this fraction of the
                         device's fp32 peak per query head. Which kernel runs decides the group
                         factor: a grouped kernel (XQA-class: the g query heads of a KV head together,
                         each K/V element read once and used g times) runs g times that rate, so it
                         stays bandwidth-bound; a per-head kernel (masked-MHA class: one query head at a
                         time) does not, so a GQA model's decode attention there costs g times the FLOPs
                         per KV byte of a multi-head one and turns compute-bound. Per-head: multi-head
                         models (g = 1, where both are the same) and models with a sliding-window
                         (cyclic) KV cache (Mistral-7B-v0.1); grouped: the other grouped-query models.
                         (The sliding-window rule is a hypothesis read off the data: the only GQA rows far
                         below the bandwidth roofline are Mistral-7B-v0.1's, and there H100 = H200 within
                         4% although H200 has 1.43x the bandwidth: compute-bound, not streaming.)
  - attn_fp8_kv_eff      decode attention over an FP8 (any 1-byte) KV cache dequantises every element it reads:
                         its FLOP rate is this fraction of the 16-bit-KV rate.
The decode-attention rate enters as Op.compute_eff of attn_scores / softmax / attn_v (capped at 1 of
the op's peak); its memory side stays the device's streaming curve, so every step still respects the
bandwidth floor (weights + KV bytes) / peak bandwidth.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sim.profiles.base import DECODE_ATTENTION_OPS, PROFILES, Profile, read_fit_yaml, register_profile

FIT_FILE = Path(__file__).resolve().parents[1] / "engine_profiles" / "gpu-published-fit.yaml"
ENGINES = ("trtllm", "vllm")


@dataclass(frozen=True)
class Term:
    name: str
    unit: str
    lo: float
    hi: float
    prior: float
    prior_source: str
    meaning: str


# Bounds are physical ranges, not tuning room; priors are what the project assumed before any fit.
TERMS = (
    Term("step_overhead_s", "s", 0.0, 0.010, 1e-3,
         "device files' host_overhead assumption (1 ms per step, hwmodels/devices/*.yaml)",
         "per-step time outside the kernels (sampling, scheduling, host syncs)"),
    Term("launch_overhead_s", "s", 0.5e-6, 8e-6, 4e-6,
         "device files' launch_overhead assumption (4 us, hwmodels/devices/*.yaml); bounds: a CUDA launch "
         "gap is 1-5 us typically",
         "per kernel launch in the stream"),
    Term("gemm_eff", "fraction", 0.5, 1.0, 1.0,
         "fused profile: the device's GEMM efficiency curve as is",
         "fraction of the device's GEMM efficiency the engine's weight GEMMs reach (prefill MFU)"),
    Term("fp8_gemm_eff", "fraction", 0.3, 1.0, 1.0,
         "fused profile: FP8 GEMMs at the FP8 peak like any dtype",
         "further fraction reached by FP8 (1-byte) weight GEMMs"),
    Term("attn_core_eff", "fraction of fp32 peak", 0.02, 1.0, 1.0,
         "no prior measurement; upper bound 1 = the fp32 CUDA-core peak",
         "decode-attention FLOP rate per query head (per-head kernel) as a fraction of the device's fp32 peak"),
    Term("attn_fp8_kv_eff", "fraction", 0.3, 1.0, 1.0,
         "1 = dequantising FP8 KV costs nothing",
         "decode-attention rate over an FP8 KV cache relative to a 16-bit one"),
)
TERM_NAMES = tuple(t.name for t in TERMS)
TERMS_BY_NAME = {t.name: t for t in TERMS}


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


def decode_attention_kernel(model) -> str:
    """'per-head' (multi-head models, sliding-window KV caches) or 'grouped' (other GQA/MQA models)."""
    if model.n_heads == model.n_kv_heads or getattr(model, "sliding_window", None) is not None:
        return "per-head"
    return "grouped"


def _adjuster(v: dict):
    gemm, fp8 = v["gemm_eff"], v["fp8_gemm_eff"]
    core, fp8_kv = v["attn_core_eff"], v["attn_fp8_kv_eff"]

    def adjust_ops(ctx, ops):
        # FP8 GEMMs: the fp8 weight dtype (per point when the points mix dtypes: 1-byte weights)
        fp8_weights = (ctx.weight_dtype == "fp8" if ctx.weight_dtype != "mixed"
                       else np.asarray(ctx.wb, float) == 1.0)
        gemm_scale = gemm * np.where(fp8_weights, fp8, 1.0)
        decode_attention = ctx.phase == "decode" and ctx.hw is not None and hasattr(ctx.hw, "peak_flops")
        if decode_attention:
            m = ctx.model
            group = m.n_heads / m.n_kv_heads
            # the grouped kernel uses each K/V element for all g query heads of its group
            reuse = 1.0 if decode_attention_kernel(m) == "per-head" else group
            fp32 = float(ctx.hw.peak_flops("fp32"))
            act_peak = np.where(np.asarray(ctx.ab, float) >= 4.0, fp32, float(ctx.hw.peak_flops("bf16")))
            kv_factor = np.where(np.asarray(ctx.kvb, float) <= 1.0, fp8_kv, 1.0)
            attn_eff = np.minimum(core * reuse * kv_factor * fp32 / act_peak, 1.0)
        for op in ops:
            if op.gemm:
                op.compute_scale = gemm_scale if np.ndim(gemm_scale) else float(gemm_scale)
            elif decode_attention and op.name in DECODE_ATTENTION_OPS:
                op.compute_eff = attn_eff if np.ndim(attn_eff) else float(attn_eff)
    return adjust_ops


# TensorRT-LLM's PyTorch backend (the 1.0 runtime; trtllm-bench's default): decode steps replay CUDA graphs,
# so a kernel pays only the GPU-side gap between kernels, not a host launch; and its overlap scheduler
# prepares step n + 1 on the host while the GPU runs step n, so the per-step host work is hidden. Both
# are the project's reading of the TensorRT-LLM 1.0 documentation (LLM API defaults: overlap scheduler
# on; the v1.0 perf-overview configs enable CUDA graphs with padding), not measurements; the gap is an
# assumption (about 1 us between graph-replayed kernels). The fitted terms stay shared: the same kernels,
# minus what the runtime hides.
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
                                  launch_overhead_s=min(launch, PYTORCH_RUNTIME_KERNEL_GAP_S), host_overhead_s=0.0)
    _RUNTIME_VARIANTS[id(profile)] = (profile, variant)
    return variant


FUSED_LAUNCHES = {"embed": 1, "norms": 2, "qkv_proj": 1, "kv_write": 1, "attn_scores": 1, "softmax": 0,
                  "attn_v": 0, "out_proj": 1, "mlp": 2, "final_norm": 1, "lm_head": 1, "score_update": 1,
                  "select_evict": 1, "select_topk": 1, "compact": 1}

DESCRIPTIONS = {
    "trtllm": "NVIDIA TensorRT-LLM (fused kernels as `fused`) with its own fitted step and launch overheads, "
              "GEMM/FP8 GEMM efficiency and CUDA-core decode attention by GQA group and KV dtype "
              "(sim/profiles/engines.py; values in sim/engine_profiles/gpu-published-fit.yaml)",
    "vllm": "vLLM (fused kernels as `fused`) with the same named terms as trtllm; values in "
            "sim/engine_profiles/gpu-published-fit.yaml (see its provenance: not fitted where the training "
            "CSV has no single-device vLLM rows)",
}


def make_profile(engine: str, values: dict, name: str | None = None) -> Profile:
    """A Profile for `engine` with term values (unregistered: the fit builds many of these)."""
    v = check_values(values, f"profile {name or engine}")
    return Profile(name=name or engine, description=DESCRIPTIONS.get(engine, engine), launches=FUSED_LAUNCHES,
                   host_overhead_s=v["step_overhead_s"], launch_overhead_s=v["launch_overhead_s"],
                   adjust_ops=_adjuster(v))


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


def register_from_file(path: Path | str = FIT_FILE) -> list[str]:
    """Register every engine profile the fit file has; the names registered."""
    data = read_fit_file(path)
    names = []
    for engine in ENGINES:
        if engine in data["engines"]:
            register_profile(make_profile(engine, engine_values(data, engine, path)))
            names.append(engine)
    return names


def register_pytorch_runtime() -> Profile | None:
    """`trtllm-pytorch`: the trtllm profile (the fit file's terms) under the PyTorch-backend runtime."""
    base = PROFILES.get("trtllm") or register_engine("trtllm")
    if base is None:
        return None
    variant = pytorch_runtime(base)
    return register_profile(dataclasses.replace(variant, name="trtllm-pytorch"))


def register_engine(engine: str) -> Profile | None:
    """Register `engine`'s profile with the fit file's values; before the first fit (no file), with the
    priors, so the name exists (sim.fit_profiles writes the file). None: the file has no such engine."""
    if FIT_FILE.is_file():
        data = read_fit_file(FIT_FILE)
        if engine not in data["engines"]:
            return PROFILES.get(engine)
        return register_profile(make_profile(engine, engine_values(data, engine, FIT_FILE)))
    if engine not in PROFILES:
        register_profile(make_profile(engine, prior_values()))
    return PROFILES[engine]
