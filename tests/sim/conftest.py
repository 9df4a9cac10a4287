"""Shared fixtures for the simulator tests.

`toy_device` is a small in-memory Device following the contract in docs/ARCHITECTURE.md, so engine
tests do not depend on the numbers in hwmodels/devices/*.yaml; `real_device` loads a shipped file.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pytest

from hwmodels.device import NEUTRAL, CalibratedTables


@dataclass(frozen=True)
class ToyDevice:
    name: str = "toy"
    memory_bytes: float = 80e9
    memory_bw: float = 2.0e12
    flops_bf16: float = 300e12
    launch_overhead_s: float = 4e-6
    host_overhead_s: float = 30e-6
    content_hash: str = "toy"
    source_path: str = "<memory>"
    tables: CalibratedTables = NEUTRAL      # no calibrated tables: a datasheet device

    def peak_flops(self, dtype: str) -> float:
        return {"fp32": self.flops_bf16 / 16, "fp8": 2 * self.flops_bf16, "int8": 2 * self.flops_bf16,
                "int4": 2 * self.flops_bf16}.get(dtype, self.flops_bf16)

    def bw_efficiency(self, nbytes):
        # ramps with the square root of the size up to 0.85 at 4 MiB: small copies do not reach peak
        return np.clip(0.85 * np.sqrt(np.asarray(nbytes, float) / 4e6), 0.02, 0.85)

    def compute_efficiency(self, flops):
        return np.clip(0.8 * np.sqrt(np.asarray(flops, float) / 1e10), 0.01, 0.8)

    def compute_equivalent_flops(self, flops, peak):
        return flops                        # the curve's sizes are FLOPs as given

    def to_dict(self):
        return dataclasses.asdict(self)


@pytest.fixture
def toy_device():
    return ToyDevice()


def real_device_names():
    try:
        from hwmodels import list_devices
    except ImportError:
        return []
    return [n for n in list_devices() if not n.startswith("cpu")]


@pytest.fixture
def real_device():
    names = real_device_names()
    if "a100-80g-sxm" not in names:
        pytest.skip("hwmodels devices not available yet")
    from hwmodels import load_device
    return load_device("a100-80g-sxm")


@pytest.fixture(params=["toy", "a100-80g-sxm", "l4"])
def device(request):
    """The toy device and two shipped ones (skipped until hwmodels ships them)."""
    if request.param == "toy":
        return ToyDevice()
    if request.param not in real_device_names():
        pytest.skip(f"device {request.param} not shipped")
    from hwmodels import load_device
    return load_device(request.param)
