"""Resolving names once per (device, model, policy, dtypes, profile): the `Setup` every timing reads (dtype
widths and peaks, launch and host seconds, the device's KV-stream factors), and the `OpContext` of a pass.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from hwmodels.dtypes import canonical_dtype, dtype_bytes
from sim import kvlen
from sim.models import ModelSpec, load_model
from sim.op import OpContext
from sim.opcost import stream_flops
from sim.profiles import AUTO, PROFILES, Profile, get_profile, resolve_profile_name


def resolve_device(hw):
    if isinstance(hw, str):
        try:
            from hwmodels import load_device
        except ImportError as exc:  # hwmodels not installed/complete: a setup problem, said in one line
            raise ValueError(f"cannot load hardware {hw!r}: hwmodels.load_device unavailable ({exc})") from None
        return load_device(hw)
    return hw


def activation_dtype(weight_dtype: str) -> str:
    """Activations stay in bf16 for 16-bit and quantised weights; fp32 weights run fp32 activations."""
    return "fp32" if weight_dtype == "fp32" else "bf16"


@dataclass(frozen=True)
class Setup:
    hw: Any
    model: ModelSpec
    policy: str
    weight_dtype: str
    kv_dtype: str
    act_dtype: str
    profile: Profile
    wb: float
    kvb: float
    ab: float
    peak_gemm: float
    peak_vector: float
    host_s: float
    # seconds charged per launch: the device's eager_call_overhead_s for eager profiles on devices
    # that have it, else launch_overhead_s (see launch_seconds)
    launch_s: float
    # seconds charged per weight-GEMM launch on top of launch_s: the device's eager_weight_switch_s for
    # eager profiles (the eager calls after a streamed weight run with cold caches), else 0
    switch_s: float
    # fractions of the streaming rate reached by the attention GEMVs over the KV cache at this
    # model's head width (Op.kv_stream); 1.0 on devices without the tables
    attn_scores_factor: float = 1.0
    attn_values_factor: float = 1.0
    # FLOP/s of the streaming kernel GEMM-class ops may run as instead of a tiled GEMM (sim.opcost.
    # stream_flops); 0.0: none (devices with a measured skinny-GEMM table)
    stream_flops: float = 0.0


_SETUP_CACHE: dict = {}


def make_setup(hw, model, policy="full", weight_dtype="bf16", kv_dtype="bf16", profile="auto") -> Setup:
    """Resolve names and dtypes once; cached, since the DES asks for the same setup every step."""
    ident = lambda o: o if isinstance(o, str) else id(o)
    key = (ident(hw), ident(model), policy, weight_dtype, kv_dtype, ident(profile))
    hit = _SETUP_CACHE.get(key)
    if (hit is not None and (isinstance(hw, str) or hit[1] is hw) and (isinstance(model, str) or hit[2] is model)
            and (not isinstance(profile, str) or profile == AUTO
                 or PROFILES.get(profile) is hit[0].profile)):   # re-registered?
        return hit[0]
    hw_obj, model_obj = resolve_device(hw), load_model(model)
    wd, kd = canonical_dtype(weight_dtype), canonical_dtype(kv_dtype)
    ad = activation_dtype(wd)
    prof = get_profile(resolve_profile_name(profile, hw_obj))
    setup = Setup(hw=hw_obj, model=model_obj, policy=kvlen.check_policy(policy), weight_dtype=wd, kv_dtype=kd,
                  act_dtype=ad, profile=prof, wb=dtype_bytes(wd), kvb=dtype_bytes(kd), ab=dtype_bytes(ad),
                  peak_gemm=float(hw_obj.peak_flops(wd)), peak_vector=float(hw_obj.peak_flops(ad)),
                  host_s=float(hw_obj.host_overhead_s if prof.host_overhead_s is None else prof.host_overhead_s)
                  + prof.extra_host_overhead_s,
                  launch_s=launch_seconds(hw_obj, prof), switch_s=switch_seconds(hw_obj, prof),
                  stream_flops=stream_flops(hw_obj), **attn_factors(hw_obj, model_obj.head_dim))
    if len(_SETUP_CACHE) > 4096:
        _SETUP_CACHE.clear()
    _SETUP_CACHE[key] = (setup, hw, model)    # holding hw/model keeps their ids valid
    return setup


def launch_seconds(hw, profile: Profile) -> float:
    """Time per launch: an eager profile's launches are top-level calls of eager model code, which cost
    the device's calibrated eager_call_overhead_s (hwmodels.calibrate's eager_call benchmark) where
    the file has one; everything else pays launch_overhead_s (a bare dispatch / kernel launch)."""
    if profile.launch_overhead_s is not None:       # an engine profile's own (fitted) launch cost
        return float(profile.launch_overhead_s)
    eager_call = hw.tables.eager_call_overhead_s if profile.eager else None
    return hw.launch_overhead_s if eager_call is None else eager_call


def switch_seconds(hw, profile: Profile) -> float:
    """Extra time per weight-GEMM launch of an eager profile: on a CPU the stream of a weight evicts the
    dispatcher's code and data, and the eager calls that follow refill them (hwmodels.calibrate's
    eager_stream benchmark). Fused profiles and devices without the figure: 0."""
    switch = hw.tables.eager_weight_switch_s if profile.eager else None
    return 0.0 if switch is None else float(switch)




def attn_factors(hw, head_dim) -> dict:
    """Setup fields of the KV-stream factors, looked up once per setup (step_time_scalar is a DES hot
    path); 1.0 (the cache streams like any op) on devices without the tables."""
    return {"attn_scores_factor": float(hw.tables.attn_scores_factor(head_dim)),
            "attn_values_factor": float(hw.tables.attn_values_factor(head_dim))}


def make_ctx(s: Setup, phase, batch, beams, new_tokens, past_tokens, cache_ratio=1.0, recent_ratio=0.3,
             completes_prompt=True) -> OpContext:
    return OpContext(model=s.model, policy=s.policy, phase=phase, batch=batch, beams=beams, rows=batch * beams,
                     new_tokens=new_tokens, past_tokens=past_tokens, cache_ratio=cache_ratio,
                     recent_ratio=recent_ratio, weight_dtype=s.weight_dtype, kv_dtype=s.kv_dtype,
                     act_dtype=s.act_dtype, wb=s.wb, kvb=s.kvb, ab=s.ab, profile=s.profile,
                     completes_prompt=completes_prompt, hw=s.hw)


@dataclass(frozen=True)
class DtypeCodes:
    """A dtype per point, given as its distinct names and each point's index into them (what a sweep has
    after factorising a column once): accepted wherever an array of dtype names is."""
    names: tuple
    codes: np.ndarray

    def first(self) -> str:
        return str(self.names[int(self.codes.flat[0])])


def per_point_dtypes(s: Setup, weight_dtype, kv_dtype, n: int) -> Setup:
    """A Setup whose dtype widths and peaks are per-point arrays, when the points mix dtypes."""
    if isinstance(weight_dtype, str) and isinstance(kv_dtype, str):
        return s
    hw = s.hw

    def coded(values):
        """(the distinct canonical names, each point's index into them): one pass over the names."""
        if isinstance(values, DtypeCodes):
            return [canonical_dtype(name) for name in values.names], np.broadcast_to(values.codes, (n,))
        arr = np.broadcast_to(np.asarray(values, dtype=object), (n,))
        names = list(dict.fromkeys(arr.tolist()))
        if len(names) == 1:
            return [canonical_dtype(names[0])], np.zeros(n, dtype=np.intp)
        lookup = {name: i for i, name in enumerate(names)}
        return [canonical_dtype(name) for name in names], np.fromiter(map(lookup.__getitem__, arr.tolist()),
                                                                      dtype=np.intp, count=n)

    weights, kvs = coded(weight_dtype), coded(kv_dtype)
    per_point = lambda code, fn: np.array([float(fn(name)) for name in code[0]], dtype=float)[code[1]]
    return replace(s, weight_dtype="mixed" if not isinstance(weight_dtype, str) else s.weight_dtype,
                   kv_dtype="mixed" if not isinstance(kv_dtype, str) else s.kv_dtype, act_dtype="mixed",
                   wb=per_point(weights, dtype_bytes), kvb=per_point(kvs, dtype_bytes),
                   ab=per_point(weights, lambda d: dtype_bytes(activation_dtype(d))),
                   peak_gemm=per_point(weights, hw.peak_flops),
                   peak_vector=per_point(weights, lambda d: hw.peak_flops(activation_dtype(d))))
