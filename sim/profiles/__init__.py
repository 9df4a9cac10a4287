"""Software-stack profiles: the same chip runs different code. One module per profile in this package
registers itself (`register_profile(Profile(...))`) when imported; `get_profile(name)` imports every module
of the package the first time a name is not registered yet, so a new profile is a new file here (or any
module that calls register_profile before the lookup) and the engine needs no change.

    auto         the default: the fitted engine profile of the device's class (default_profile_name)
    fused, ideal ideal fused kernels: the bound                          sim/profiles/fused.py
    hf           transformers defaults: SDPA, DynamicCache, greedy     sim/profiles/hf.py
    hf-eager     the Keyformer paper's eager MPT stack                 sim/profiles/hf_eager.py
    kvsim-eager  this project's keyformer/ stack on eager PyTorch      sim/profiles/kvsim_eager.py
    trtllm, vllm serving engines: fused operators plus fitted terms    sim/profiles/trtllm.py, vllm.py

Shared pieces: `base` (Profile, the registry), `eager` (what the eager stacks share), `engines` (the
engine profiles' named terms and their fit file, sim/engine_profiles/*.yaml).
"""
from __future__ import annotations

import importlib
import pkgutil

from sim.profiles import fused as _fused  # noqa: F401  (the default is always registered)
from sim.profiles.base import CORE_OPS, PROFILES, Profile, register_profile


AUTO = "auto"
# The profile a prediction without --profile runs under, by device class: a GPU runs a serving engine (the
# TensorRT-LLM-class profile fitted to published GPU measurements), a CPU runs plain transformers (`hf`, no
# fitted term); a device with no engine profile (TPU) the ideal kernels, named as such in every output.
CLASS_DEFAULTS = {"gpu": "trtllm", "cpu": "hf", "other": "fused"}


def device_class(device) -> str:
    """'cpu', 'gpu' or 'other' (TPU) from a hwmodels Device's name and description."""
    text = f"{getattr(device, 'name', '')} {getattr(device, 'description', '')}".lower()
    if "tpu" in text or getattr(device, "name", "") == "none":     # no device (sim.engine.memory's stand-in)
        return "other"
    if text.startswith("cpu") or any(w in text for w in (" cpu", "xeon", "epyc", "ryzen", "core(tm)", "apple m")):
        return "cpu"
    return "gpu"


def default_profile_name(device) -> str:
    """The profile `auto` stands for on `device` (a hwmodels Device or a name/path)."""
    if isinstance(device, str):
        from hwmodels import load_device
        device = load_device(device)
    return CLASS_DEFAULTS[device_class(device)]


def resolve_profile_name(name, device):
    """`name`, with `auto` replaced by the device's default (a Profile object passes through)."""
    return default_profile_name(device) if name == AUTO else name


def get_profile(name_or_profile) -> Profile:
    if isinstance(name_or_profile, Profile):
        return name_or_profile
    if name_or_profile == AUTO:
        raise ValueError("profile 'auto' stands for the device's default: resolve it with the device "
                         "(sim.profiles.resolve_profile_name)")
    if name_or_profile not in PROFILES:
        load_all()
    try:
        return PROFILES[name_or_profile]
    except KeyError:
        raise ValueError(f"unknown profile {name_or_profile!r}; registered: {', '.join(sorted(PROFILES))}") from None


def load_all() -> None:
    """Import every module of this package: each profile module registers its profile on import."""
    for info in pkgutil.iter_modules(__path__):
        name = f"{__name__}.{info.name}"
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:      # the module exists but is broken: say so
                raise



__all__ = ["AUTO", "CORE_OPS", "PROFILES", "Profile", "default_profile_name", "device_class", "get_profile",
           "load_all", "register_profile", "resolve_profile_name"]
