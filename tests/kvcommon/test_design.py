"""kvcommon.design: DesignPoint's one default and one range check per field."""
import pytest

from kvcommon import DesignPoint, FieldError
from kvcommon.design import DEFAULT_RECENT_RATIO
from kvcommon.dtypes import canonical_dtype, dtype_bytes


def point(**kwargs):
    return DesignPoint(**{"hw": "h100-sxm", "model": "mpt-7b", "prompt": 512, "gen": 64, **kwargs})


def test_defaults():
    p = point()
    assert (p.batch, p.beams, p.policy, p.cache_ratio, p.recent_ratio) == (1, 1, "full", 1.0, DEFAULT_RECENT_RATIO)
    assert (p.kv_dtype, p.weight_dtype, p.profile) == ("bf16", "bf16", "auto")   # the device's fitted default
    assert DEFAULT_RECENT_RATIO == 0.3


@pytest.mark.parametrize("field, value, message", [
    ("cache_ratio", 0.0, "cache_ratio must be in (0, 1], got 0.0"),
    ("cache_ratio", 1.5, "cache_ratio must be in (0, 1], got 1.5"),
    ("recent_ratio", -0.1, "recent_ratio must be in [0, 1], got -0.1"),
    ("batch", 0, "batch must be >= 1, got 0"),
    ("beams", 0, "beams must be >= 1, got 0"),
    ("prompt", 0, "prompt must be >= 1, got 0"),
    ("gen", -3, "gen must be >= 1, got -3"),
    ("kv_dtype", "fp64", "kv_dtype must be one of fp32, bf16, fp16, fp8, int8, int4, got 'fp64'"),
])
def test_range_checks_name_fields(field, value, message):
    with pytest.raises(FieldError) as exc:
        point(**{field: value})
    assert str(exc.value) == message and exc.value.field == field


def test_edges_accepted_and_dtypes_normalised():
    p = point(cache_ratio=1.0, recent_ratio=0.0, kv_dtype="float16", weight_dtype="BF16")
    assert (p.kv_dtype, p.weight_dtype) == ("fp16", "bf16")
    assert canonical_dtype("torch.bfloat16") == "bf16" and dtype_bytes("int4") == 0.5


def test_policy_params_are_frozen_and_sorted():
    p = point(policy="keyformer", policy_params={"tau": 2, "noise": "gaussian"})
    assert p.policy_params == (("noise", "gaussian"), ("tau", 2))
    assert str(p.variant) == "keyformer:noise=gaussian,tau=2"
    assert hash(p) == hash(point(policy="keyformer", policy_params=(("tau", 2), ("noise", "gaussian"))))


def test_hwmodels_dtypes_is_the_same_table():
    import hwmodels.dtypes
    import kvcommon.dtypes
    assert hwmodels.dtypes.BYTES_PER_ELEMENT is kvcommon.dtypes.BYTES_PER_ELEMENT
