"""Eager profiles charge each launch the device's calibrated eager_call_overhead (when the file has
one); every other profile, and every device without the field, keeps launch_overhead."""
import numpy as np
import pytest
import yaml

from hwmodels import load_device
from sim.engine import decode_step_time, evaluate, make_setup, predict
from sim.profiles import get_profile

A100 = "a100-80g-sxm"
POINTS = dict(batch=np.array([1.0, 4.0]), prompt=np.array([512.0, 2048.0]), gen=np.array([64.0, 32.0]))


def with_time(tmp_path, name, key, microseconds):
    """The shipped A100 file plus one optional time entry (eager_call_overhead, ...)."""
    with open(load_device(A100).source_path) as f:
        data = yaml.safe_load(f)
    data["name"] = name
    data[key] = {"value": microseconds, "unit": "us", "source": "test"}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def with_eager_call(tmp_path, name, microseconds):
    return with_time(tmp_path, name, "eager_call_overhead", microseconds)


def test_eager_profiles_are_marked():
    assert get_profile("hf-eager").eager and get_profile("kvsim-eager").eager
    assert not get_profile("fused").eager


def test_setup_launch_time_picks_the_eager_call_only_for_eager_profiles(tmp_path):
    plain = load_device(A100)
    assert plain.tables.eager_call_overhead_s is None                     # datasheet files stay without it
    eager_hw = with_eager_call(tmp_path, "a100-eager", 25)
    assert load_device(eager_hw).tables.eager_call_overhead_s == pytest.approx(25e-6)
    for profile in ("hf-eager", "kvsim-eager"):
        assert make_setup(eager_hw, "llama-2-7b", profile=profile).launch_s == pytest.approx(25e-6)
        assert make_setup(A100, "llama-2-7b", profile=profile).launch_s == plain.launch_overhead_s
    assert make_setup(eager_hw, "llama-2-7b", profile="fused").launch_s == plain.launch_overhead_s


def test_eager_call_slows_eager_profiles_by_the_launch_count(tmp_path):
    plain = load_device(A100)
    same = with_eager_call(tmp_path, "a100-same", plain.launch_overhead_s * 1e6)
    slower = with_eager_call(tmp_path, "a100-slower", plain.launch_overhead_s * 1e6 + 10)
    for profile in ("hf-eager", "kvsim-eager"):
        base = evaluate(A100, "llama-2-7b", "full", profile=profile, **POINTS)
        # the eager-call time equal to the launch time: the very same numbers
        assert np.array_equal(evaluate(same, "llama-2-7b", "full", profile=profile, **POINTS)["tpot_s"],
                              base["tpot_s"])
        # 10 us more per launch: one decode step (gen=2) grows by 10 us per launch it counts
        pred = predict(A100, "llama-2-7b", 1, 512, 2, "full", 1.0, profile=profile)
        slow = predict(slower, "llama-2-7b", 1, 512, 2, "full", 1.0, profile=profile)
        launches = (slow.tpot_s - pred.tpot_s) / 10e-6
        assert launches > 10 * 32          # eager code: many calls in each of the 32 layers
    kv = np.full(2, 1000.0)
    assert decode_step_time(slower, "llama-2-7b", kv, profile="kvsim-eager") > \
        decode_step_time(A100, "llama-2-7b", kv, profile="kvsim-eager")


def test_fused_profile_ignores_the_eager_call(tmp_path):
    slower = with_eager_call(tmp_path, "a100-slower", 50)
    for name in ("ttft_s", "tpot_s", "e2e_s"):
        assert np.array_equal(evaluate(slower, "llama-2-7b", "full", **POINTS)[name],
                              evaluate(A100, "llama-2-7b", "full", **POINTS)[name])
    kv = np.full(2, 1000.0)
    assert decode_step_time(slower, "llama-2-7b", kv) == decode_step_time(A100, "llama-2-7b", kv)


def test_devices_without_the_field_predict_as_before(toy_device):
    # Test doubles without eager_call_overhead_s (and without the attribute at all) use launch_overhead_s.
    assert make_setup(toy_device, "llama-2-7b", profile="hf-eager").launch_s == toy_device.launch_overhead_s


def test_weight_switch_is_charged_once_per_weight_gemm_launch_of_eager_profiles(tmp_path):
    switched = with_time(tmp_path, "a100-switch", "eager_weight_switch_overhead", 100)
    assert load_device(switched).tables.eager_weight_switch_s == pytest.approx(100e-6)
    assert load_device(A100).tables.eager_weight_switch_s is None
    model = "llama-2-7b"        # 32 layers; per layer q, k, v, o and gate, up, down: 7 weight GEMMs
    for profile in ("hf-eager", "kvsim-eager"):
        assert make_setup(switched, model, profile=profile).switch_s == pytest.approx(100e-6)
        kv = np.full(1, 1000.0)
        extra = (decode_step_time(switched, model, kv, profile=profile)
                 - decode_step_time(A100, model, kv, profile=profile))
        assert extra == pytest.approx((32 * 7 + 1) * 100e-6, rel=1e-6)     # + the LM head
        # the vectorised path agrees with the scalar one
        base = evaluate(A100, model, "full", profile=profile, **POINTS)["tpot_s"]
        slow = evaluate(switched, model, "full", profile=profile, **POINTS)["tpot_s"]
        assert np.allclose(slow - base, (32 * 7 + 1) * 100e-6, rtol=1e-6)
    # fused profiles and devices without the figure: nothing added
    assert make_setup(switched, model, profile="fused").switch_s == 0.0
    assert make_setup(A100, model, profile="kvsim-eager").switch_s == 0.0
    assert decode_step_time(switched, model, np.full(1, 1000.0)) == decode_step_time(A100, model, np.full(1, 1000.0))
