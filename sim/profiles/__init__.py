"""Software-stack profiles: the same chip runs different code. One module per profile in this package
registers itself (`register_profile(Profile(...))`) when imported; `get_profile(name)` imports every module
of the package the first time a name is not registered yet, so a new profile is a new file here (or any
module that calls register_profile before the lookup) and the engine needs no change.

    fused        ideal fused kernels (the default)                      sim/profiles/fused.py
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


def get_profile(name_or_profile) -> Profile:
    if isinstance(name_or_profile, Profile):
        return name_or_profile
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



__all__ = ["CORE_OPS", "PROFILES", "Profile", "get_profile", "load_all", "register_profile"]
