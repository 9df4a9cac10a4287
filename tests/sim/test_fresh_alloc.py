"""Copies into freshly allocated tensors (hf-eager's cache growth, beam reorder, repeat_kv) on a device
whose file has a fresh_alloc_efficiency table; no change on devices without one; GQA's repeat_kv."""
import numpy as np
import pytest
import yaml

from hwmodels import DEVICES_DIR, load_device
from hwmodels.calibrate.fit import Series, fit_fresh_alloc
from sim.engine import decode_step_time, make_ctx, make_setup, predict, time_ops
from sim.ops import group_ops

MiB = 2**20
TABLE = [[16 * MiB, 1.0], [30 * MiB, 1.0], [34 * MiB, 0.25], [128 * MiB, 0.25]]


def a100_file(tmp_path, name, fresh=None):
    data = yaml.safe_load((DEVICES_DIR / "a100-80g-sxm.yaml").read_text())
    data["name"] = name
    if fresh is not None:
        data["fresh_alloc_efficiency"] = {"form": "table", "size_unit": "B", "source": "test", "points": fresh}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


@pytest.fixture
def devices(tmp_path):
    return a100_file(tmp_path, "plain"), a100_file(tmp_path, "fresh", TABLE)


def hf_ops(hw, model, past, beams=4.0, batch=1.0):
    s = make_setup(hw, model, "full", "fp32", "fp32", "hf-eager")
    return s, group_ops(make_ctx(s, "decode", batch, beams, 1.0, past))


def test_the_table_loads_any_shape_and_the_factor_is_one_without_it(devices):
    plain, fresh = (load_device(p) for p in devices)
    assert plain.fresh_alloc_factor(64 * MiB) == 1.0
    assert fresh.fresh_alloc_factor(8 * MiB) == pytest.approx(1.0)          # held below the table
    assert fresh.fresh_alloc_factor(64 * MiB) == pytest.approx(0.25)
    assert fresh.to_dict()["fresh_alloc_efficiency"]["points"][2] == [34 * MiB, 0.25]


def test_only_the_ops_that_allocate_slow_down_and_by_exactly_the_factor(devices):
    plain, fresh = devices
    # mpt-7b, 4 beams, 4096 cached tokens in fp32: one layer's K for all rows is 4 x 4096 x 4096 x 4 B = 256 MiB
    s_plain, ops = hf_ops(plain, "mpt-7b", 4096.0)
    s_fresh, _ = hf_ops(fresh, "mpt-7b", 4096.0)
    fast, slow = time_ops(s_plain, ops), time_ops(s_fresh, ops)
    marked = [i for i, op in enumerate(ops) if op.fresh_tensor_bytes is not None]
    assert {ops[i].name for i in marked} == {"cache_concat", "beam_reorder"}
    for i in marked:
        assert float(ops[i].fresh_tensor_bytes) > 128 * MiB
        assert slow.t_memory[i] == pytest.approx(fast.t_memory[i] / 0.25, rel=1e-12)
    others = [i for i in range(len(ops)) if i not in marked]
    assert np.array_equal(slow.t_memory[others], fast.t_memory[others])
    # below the allocator's threshold nothing changes (64 cached tokens: 4 MiB per tensor)
    short = [decode_step_time(hw, "mpt-7b", np.full(1, 64.0), weight_dtype="fp32", kv_dtype="fp32",
                              profile="hf-eager", beams=4) for hw in devices]
    assert short[0] == pytest.approx(short[1], rel=1e-12)


def test_datasheet_files_and_fused_predictions_are_unchanged(devices):
    """No shipped datasheet file has the table: the paper's rows and every fused prediction stay as
    they were; on a device with it, only eager stacks that allocate pay."""
    for path in DEVICES_DIR.glob("*.yaml"):
        if "cpu-local" not in path.name:
            assert load_device(path).tables.fresh_alloc_curve is None, path.name
    plain, fresh = devices
    args = dict(model="mpt-7b", batch=1, prompt=4096, gen=64, policy="full", cache_ratio=1.0, kv_dtype="fp32",
                weight_dtype="fp32", beams=4)
    fused = [predict(hw, profile="fused", **args).tokens_per_s for hw in devices]
    assert fused[0] == pytest.approx(fused[1], rel=1e-12)
    eager = [predict(hw, profile="hf-eager", **args).tokens_per_s for hw in devices]
    assert eager[1] < 0.8 * eager[0]


def test_repeat_kv_for_grouped_query_models_only(devices):
    plain, _ = devices
    _, gqa = hf_ops(plain, "llama-3-8b", 1000.0)          # 32 query heads share 8 KV heads
    names = {op.name: op for op in gqa}
    rep, extra = names["repeat_kv"], names["attn_expanded_read"]
    cached = 2 * 4 * 8 * 1001 * 128 * 4                     # K and V of 4 rows x 8 KV heads x 1001 keys, fp32
    assert float(rep.kv_read_bytes) == pytest.approx(cached)
    assert float(rep.kv_write_bytes) == pytest.approx(4 * cached)     # expanded to 32 heads
    assert float(rep.fresh_tensor_bytes) == pytest.approx(2 * cached)  # each of K and V: half the write
    assert float(extra.kv_read_bytes) == pytest.approx(3 * cached)    # attention reads the expanded copies
    _, mha = hf_ops(plain, "mpt-7b", 1000.0)
    assert not {"repeat_kv", "attn_expanded_read"} & {op.name for op in mha}


def test_fit_takes_the_ratio_per_tensor_size_without_a_monotone_cap():
    fresh = Series("fresh_copy", "x", "bytes", [(2 * 16 * MiB, 2e-3), (2 * 64 * MiB, 32e-3)])
    ref = Series("fresh_copy_ref", "x", "bytes", [(2 * 16 * MiB, 2.2e-3), (2 * 64 * MiB, 8e-3)])
    table = fit_fresh_alloc({"fresh_copy": fresh, "fresh_copy_ref": ref})
    assert table.sizes == (16 * MiB, 64 * MiB)                # keyed by the tensor, not the bytes moved
    assert table.fractions == (1.0, 0.25)                     # capped at 1; drops where pages are fresh
    assert fit_fresh_alloc({"fresh_copy": fresh}) is None


def test_the_table_is_not_blended_across_the_allocators_threshold(devices):
    # glibc maps every tensor above 32 MiB (its largest mmap threshold) to fresh pages: between the last
    # heap size (30 MiB) and the first mapped one (34 MiB) a tensor takes its own side's values, not a
    # log-size blend of the two; within a side the table interpolates as before
    fresh = load_device(devices[1])
    assert fresh.fresh_alloc_factor(33 * MiB) == pytest.approx(0.25)         # held at the mapped side's start
    assert fresh.fresh_alloc_factor(32 * MiB) == pytest.approx(1.0)          # held at the heap side's end
    assert fresh.fresh_alloc_factor(1024 * MiB) == pytest.approx(0.25)       # held beyond the table
    np.testing.assert_allclose(fresh.fresh_alloc_factor(np.array([20 * MiB, 33 * MiB])), [1.0, 0.25])
