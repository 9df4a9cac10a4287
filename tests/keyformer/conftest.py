"""The one matrix of the keyformer tests: every policy on every architecture."""
from __future__ import annotations

import pytest

from tests.keyformer.tiny_models import ARCHITECTURES, build

POLICY_NAMES = ("full", "window", "streaming", "h2o", "keyformer", "snapkv", "tova", "mass", "pyramidkv", "adakv")
MATRIX = [(policy, arch) for policy in POLICY_NAMES for arch in ARCHITECTURES]


@pytest.fixture(params=MATRIX, ids=[f"{p}-{a}" for p, a in MATRIX])
def case(request):
    """(policy name, architecture name, tiny model)."""
    policy, arch = request.param
    return policy, arch, build(arch)


@pytest.fixture(params=list(ARCHITECTURES))
def arch_model(request):
    return request.param, build(request.param)
