"""sim.profiles: one module per profile, found by the registry (no list of modules to keep in sync)."""
import pkgutil

import pytest

import sim.profiles as profiles
from sim.profiles import PROFILES, Profile, get_profile, load_all

SHIPPED = {"fused", "hf", "hf-eager", "hf-fit", "kvsim-eager", "trtllm", "trtllm-pytorch", "vllm", "vllm-v0"}
HELPERS = {"base", "eager", "engines", "attention"}      # shared pieces, no profile of their own


def test_every_profile_module_registers_its_profile():
    load_all()
    assert SHIPPED | {"ideal"} <= set(PROFILES)      # ideal: fused under the name of the bound
    modules = {m.name for m in pkgutil.iter_modules(profiles.__path__)} - HELPERS
    assert {m.replace("_", "-") for m in modules} == SHIPPED
    for name in modules:
        module = __import__(f"sim.profiles.{name}", fromlist=["PROFILE"])
        assert module.PROFILE is get_profile(name.replace("_", "-"))


def test_get_profile_passes_objects_through_and_names_unknown_ones():
    p = get_profile("fused")
    assert isinstance(p, Profile) and get_profile(p) is p
    with pytest.raises(ValueError, match="unknown profile 'nope'; registered: .*fused"):
        get_profile("nope")
