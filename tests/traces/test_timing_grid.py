"""traces.timing.grid: policy points in the one variant grammar, the grid's field checks."""
from __future__ import annotations

import pytest

from kvcommon.fields import FieldError
from traces.timing.grid import PolicyPoint, TimingGrid
from traces.timing_format import TimingError


@pytest.mark.parametrize("text, point", [("full", ("full", 1.0)), ("full:1", ("full", 1.0)),
                                         ("keyformer:0.5", ("keyformer", 0.5)), ("h2o:1", ("h2o", 1.0)),
                                         ("keyformer:cache_ratio=0.2", ("keyformer", 0.2))])
def test_policy_points(text, point):
    parsed = PolicyPoint.parse(text)
    assert (parsed.name, parsed.ratio) == point
    assert PolicyPoint.parse(parsed.label()) == parsed


@pytest.mark.parametrize("text, message", [("keyformer", "needs a ratio"), ("keyformer:0", "ratio must be in (0, 1]"),
                                           ("keyformer:x", "is not a number"), ("full:0.5", "whole context"),
                                           (":0.5", "expected NAME or NAME:RATIO"),
                                           ("h2o:0.5,noise=x", "the cache ratio only")])
def test_bad_policy_points(text, message):
    with pytest.raises(TimingError, match=message.replace("(", r"\(").replace(")", r"\)").replace("]", r"\]")):
        PolicyPoint.parse(text)


@pytest.mark.parametrize("kwargs, message", [
    ({"batches": (0,)}, "batches must be >= 1, got 0"), ({"repeats": 0}, "repeats must be >= 1, got 0"),
    ({"warmup": -1}, "warmup must be >= 0, got -1"), ({"prefill_contexts": (1,)}, "prefill_contexts must be >= 2"),
    ({"dtype": "int4"}, "dtype must be one of fp32, bf16, fp16"), ({"beams": 2}, "beams needs stack hf"),
    ({"stack": "hf", "prefill_contexts": ()}, "policies must be full only with stack hf"),
    ({"contexts": ()}, "contexts must hold at least one value")])
def test_grid_errors_name_fields(kwargs, message):
    with pytest.raises(FieldError) as exc:
        TimingGrid(**kwargs)
    assert str(exc.value).startswith(message)


def test_points_and_settings():
    grid = TimingGrid(batches=(1, 2), contexts=(64,), policies=(PolicyPoint("full", 1.0),), prefill_contexts=(16,))
    assert [p["batch"] for p in grid.decode_points()] == [1, 2] and grid.prefill_points()[0]["context"] == 16
    assert grid.settings() == {"repeats": 7, "warmup": 2, "threads": 1, "dtype": "fp32", "device": "cpu", "seed": 0}
    hf = TimingGrid(stack="hf", beams=4, policies=(PolicyPoint("full", 1.0),), prefill_contexts=())
    assert hf.software == "hf-eager" and hf.settings()["stack"] == "hf"
