"""The engine's KV-stream factors: attention GEMVs over the cache slowed by the device's tables."""
import numpy as np
import pytest
import yaml

from hwmodels import DEVICES_DIR
from sim.engine import decode_step_time, make_ctx, make_setup, mixed_step_time, predict, step_time_scalar, time_ops
from sim.models import load_model
from sim.ops import group_ops

SCORES, VALUES = 0.5, 0.8      # llama-2-7b has 128-wide heads: the factors at 128 below


def a100_file(tmp_path, name, scores=None, values=None):
    data = yaml.safe_load((DEVICES_DIR / "a100-80g-sxm.yaml").read_text())
    data["name"] = name
    for key, points in (("attn_scores_efficiency", scores), ("attn_values_efficiency", values)):
        if points is not None:
            data[key] = {"form": "table", "size_unit": "head_dim", "source": "test", "points": points}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


@pytest.fixture
def devices(tmp_path):
    plain = a100_file(tmp_path, "plain")
    slow = a100_file(tmp_path, "slow", [[64, 0.3], [128, SCORES]], [[64, 0.6], [128, VALUES], [256, 0.9]])
    ones = a100_file(tmp_path, "ones", [[64, 1.0], [128, 1.0]], [[128, 1.0]])
    return plain, slow, ones


def decode_ops(hw, model="llama-2-7b", profile="kvsim-eager", batch=32.0, past=8000.0):
    s = make_setup(hw, model, "full", "bf16", "bf16", profile)
    return s, group_ops(make_ctx(s, "decode", batch, 1.0, 1.0, past))


def test_setup_looks_the_factors_up_at_the_model_head_width(devices):
    plain, slow, _ = devices
    s = make_setup(slow, "llama-2-7b", "full", "bf16", "bf16", "kvsim-eager")
    assert (s.attn_scores_factor, s.attn_values_factor) == (pytest.approx(SCORES), pytest.approx(VALUES))
    assert make_setup(slow, "gpt2", "full", "bf16", "bf16").attn_scores_factor == pytest.approx(0.3)   # d=64
    p = make_setup(plain, "llama-2-7b")
    assert (p.attn_scores_factor, p.attn_values_factor) == (1.0, 1.0)


@pytest.mark.parametrize("profile", ["kvsim-eager", "fused"])
def test_attention_memory_time_slows_by_exactly_one_over_the_factor(devices, profile):
    plain, slow, _ = devices
    s_plain, ops = decode_ops(plain, profile=profile)
    s_slow, _ = decode_ops(slow, profile=profile)
    fast, slowed = time_ops(s_plain, ops), time_ops(s_slow, ops)
    by_name = {name: i for i, name in enumerate(fast.names)}
    if profile == "fused":
        # one flash kernel: its row holds the memory time of all its ops, each stream at its own factor
        members = [i for i, op in enumerate(ops) if op.name == "attn_scores" or op.fused_into == "attn_scores"]
        nbytes = lambda i: ops[i].act_bytes + ops[i].kv_read_bytes + ops[i].kv_write_bytes + ops[i].weight_bytes
        rate = s_plain.hw.memory_bw * float(s_plain.hw.bw_efficiency(sum(nbytes(i) for i in members)))
        by_kind = {"scores": SCORES, "values": VALUES}
        want = s_plain.model.n_layers * sum(nbytes(i) / rate / by_kind.get(ops[i].kv_stream, 1.0) for i in members)
        host = by_name["attn_scores"]
        assert fast.t_memory[host] > fast.t_compute[host]
        assert slowed.t_memory[host] == pytest.approx(want, rel=1e-12)
        assert slowed.t_memory[by_name["attn_v"]] == 0.0            # its seconds are on the kernel's row
    else:
        for name, factor in (("attn_scores", SCORES), ("attn_v", VALUES)):
            i = by_name[name]
            assert ops[i].kv_stream in ("scores", "values")
            assert fast.t_memory[i] > fast.t_compute[i]                   # memory-bound: the factor decides
            assert slowed.t_memory[i] == pytest.approx(fast.t_memory[i] / factor, rel=1e-12)
    others = [i for i, op in enumerate(ops) if op.kv_stream is None and op.fused_into is None and op.name != "attn_scores"]
    assert np.array_equal(slowed.t_memory[others], fast.t_memory[others])
    assert np.array_equal(slowed.t_compute, fast.t_compute)
    # the DES scalar path agrees with the vectorised one
    assert step_time_scalar(s_slow, ops) == pytest.approx(float(slowed.step_time), rel=1e-12)
    assert step_time_scalar(s_slow, ops) > step_time_scalar(s_plain, ops)


def test_the_bandwidth_floor_still_holds(devices):
    _, slow, _ = devices
    s, ops = decode_ops(slow)
    timed = time_ops(s, ops)
    nbytes = sum(timed.fields[f] for f in ("weight_bytes", "act_bytes", "kv_read_bytes", "kv_write_bytes"))
    assert np.all(timed.t_memory >= nbytes / s.hw.memory_bw * (1 - 1e-12))


def test_devices_without_tables_are_unchanged(devices):
    # unit factors take the no-table path: predictions are bit-identical to the file without tables
    plain, _, ones = devices
    a = predict(plain, "llama-2-7b", 8, 2048, 64, "h2o", 0.5, profile="kvsim-eager")
    b = predict(ones, "llama-2-7b", 8, 2048, 64, "h2o", 0.5, profile="kvsim-eager")
    assert a.summary() == b.summary()
    kv = np.full(4, 1500.0)
    assert decode_step_time(plain, "llama-2-7b", kv) == decode_step_time(ones, "llama-2-7b", kv)
    assert mixed_step_time(plain, "gpt2", [100.0], [(256, 0)]) == mixed_step_time(ones, "gpt2", [100.0], [(256, 0)])


def test_long_context_decode_is_slower_with_the_tables(devices):
    plain, slow, _ = devices
    kw = dict(profile="kvsim-eager")
    fast = predict(plain, "llama-2-7b", 16, 16000, 32, "full", 1.0, **kw)
    slowed = predict(slow, "llama-2-7b", 16, 16000, 32, "full", 1.0, **kw)
    assert slowed.tpot_s > fast.tpot_s
    # the slowdown is the attention ops' memory time times (1/f - 1), nothing else
    dec = fast.decode_ops[fast.decode_ops.step == "first"].set_index("op")["time_s"]
    dec_slow = slowed.decode_ops[slowed.decode_ops.step == "first"].set_index("op")["time_s"]
    assert dec_slow.drop(["attn_scores", "attn_v"]).equals(dec.drop(["attn_scores", "attn_v"]))
    assert dec_slow["attn_scores"] > dec["attn_scores"] and dec_slow["attn_v"] > dec["attn_v"]
    assert load_model("llama-2-7b").head_dim == 128        # the factors above are the 128 points
