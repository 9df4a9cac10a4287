"""sim.engine.scalar (the DES's step time on floats) against the numpy path it replaces: the same float,
bit for bit, on every shipped GPU, engine profile, policy, KV dtype and step kind, and the numpy path
wherever the float path does not cover the case."""
from __future__ import annotations

import zlib

import numpy as np
import pytest

from sim.engine import scalar
from sim.engine.setup import make_ctx, make_setup
from sim.engine.timing import numpy_step_time, step_time_scalar
from sim.kvlen import POLICIES
from sim.ops import dense_ops, group_ops
from sim.profiles import PROFILES, load_all

load_all()
GPUS = ("a100-40g-sxm", "h100-sxm", "h200-sxm", "b200", "l4", "mi300x", "tpu-v5e")
MODELS = ("llama-3-8b", "mistral-7b-v0.1", "gpt2")     # GQA, sliding window, MHA


def _steps(s, rng):
    """(name, ops) of decode, prefill and dense tables at random shapes."""
    for _ in range(3):
        rows = float(rng.integers(1, 512))
        past = float(rng.uniform(1.0, 9000.0))
        yield "decode", group_ops(make_ctx(s, "decode", rows, 1.0, 1.0, past, recent_ratio=0.3))
        new = float(rng.integers(1, 4096))
        ctx = make_ctx(s, "prefill", 1.0, 1.0, new, float(rng.integers(0, 2048)), float(rng.uniform(0.1, 1.0)),
                       0.3, bool(rng.integers(0, 2)))
        yield "prefill", group_ops(ctx)
        yield "dense", dense_ops(make_ctx(s, "prefill", rows, 1.0, float(rng.integers(1, 64)), 0.0))


@pytest.mark.parametrize("hw", GPUS)
def test_float_path_is_the_numpy_path_bit_for_bit(hw):
    rng = np.random.default_rng(zlib.crc32(hw.encode()))
    checked = 0
    for profile in sorted(PROFILES):
        for model in MODELS:
            for policy in POLICIES:
                for kv_dtype in ("bf16", "fp8"):
                    try:
                        s = make_setup(hw, model, policy, "bf16", kv_dtype, profile)
                    except ValueError:      # a dtype the device or profile does not run
                        continue
                    for kind, ops in _steps(s, rng):
                        fast = scalar.scalar_step_seconds(s, ops)
                        assert fast is not None, (hw, profile, model, policy, kind)
                        for host in (True, False):
                            fast = scalar.scalar_step_seconds(s, ops, host)
                            slow = numpy_step_time(s, ops, host)
                            assert fast == slow, (hw, profile, model, policy, kv_dtype, kind, fast, slow)
                        checked += 1
    assert checked > 300


def test_cpu_tables_and_array_fields_take_the_numpy_path():
    s = make_setup("cpu-local", "gpt2", "h2o", "fp32", "fp32", "hf")
    ops = group_ops(make_ctx(s, "decode", 4.0, 1.0, 1.0, 300.0, recent_ratio=0.3))
    assert not scalar.covers(s, ops) and scalar.scalar_step_seconds(s, ops) is None
    assert step_time_scalar(s, ops) == numpy_step_time(s, ops)
    g = make_setup("h100-sxm", "llama-3-8b", "full", "bf16", "bf16", "trtllm")
    arrays = group_ops(make_ctx(g, "decode", 8.0, 1.0, 1.0, np.array([100.0, 200.0]), recent_ratio=0.3))
    assert not scalar.covers(g, arrays)
