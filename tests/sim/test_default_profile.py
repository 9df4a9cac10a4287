"""A prediction without --profile runs the fitted engine profile of the device's class (GPU: trtllm, CPU: hf;
a TPU, with no engine profile: fused), and every output names the profile it ran; `ideal` is the ideal-kernel
bound under the name that says so."""
from __future__ import annotations

import json

import numpy as np
import pytest

from hwmodels import load_device
from sim import engine, predict
from sim.profiles import AUTO, default_profile_name, device_class, get_profile, resolve_profile_name


@pytest.mark.parametrize("hw, cls, name", [("h200-sxm", "gpu", "trtllm"), ("a100-80g-sxm", "gpu", "trtllm"),
                                           ("mi300x", "gpu", "trtllm"), ("cpu-local", "cpu", "hf"),
                                           ("tpu-v5e", "other", "fused")])
def test_device_classes(hw, cls, name):
    device = load_device(hw)
    assert device_class(device) == cls and default_profile_name(device) == name == default_profile_name(hw)
    assert resolve_profile_name(AUTO, hw) == name and resolve_profile_name("hf-eager", hw) == "hf-eager"


@pytest.mark.parametrize("hw, name", [("h200-sxm", "trtllm"), ("cpu-local", "hf"), ("tpu-v5e", "fused")])
def test_predict_without_profile_names_the_one_it_ran(hw, name, capsys):
    args = ["--hw", hw, "--model", "llama-2-7b", "--prompt", "512", "--gen", "64"]
    assert predict.main(args) == 0
    assert f"({name} profile)" in capsys.readouterr().out
    assert predict.main(args + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert json.dumps(out).count(f'"{name}"') >= 1 and '"auto"' not in json.dumps(out)


def test_auto_equals_the_named_default_and_ideal_equals_fused():
    kv = np.full(16, 1024.0)
    auto = engine.decode_step_time("h100-sxm", "llama-3-8b", kv, profile=AUTO)
    assert auto == engine.decode_step_time("h100-sxm", "llama-3-8b", kv, profile="trtllm")
    assert engine.decode_step_time("h100-sxm", "llama-3-8b", kv, profile="ideal") == \
        engine.decode_step_time("h100-sxm", "llama-3-8b", kv, profile="fused")
    # the ideal kernels are the bound: the fitted engine is never faster
    assert auto >= engine.decode_step_time("h100-sxm", "llama-3-8b", kv, profile="ideal")
    with pytest.raises(ValueError, match="auto"):
        get_profile(AUTO)


def test_sweep_table_names_each_device_default():
    from sim.sweep.grid import GridConfig, build_grid
    grid = build_grid(GridConfig(hw=["h200-sxm", "cpu-local"], models=["gpt2"], policies=["full"], batches=[1],
                                 prompts=[128], gens=[8]))
    assert dict(zip(grid["hw"], grid["profile"])) == {"h200-sxm": "trtllm", "cpu-local": "hf"}
