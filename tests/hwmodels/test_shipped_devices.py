"""The shipped hardware files: they load, carry sources, and hold the datasheet numbers."""
import json
import math
import time

import numpy as np
import pytest

import hwmodels
from hwmodels import load_device
from hwmodels.dtypes import DTYPES

EXPECTED = ["a100-40g-sxm", "a100-80g-sxm", "h100-sxm", "h200-sxm", "mi300x", "l4", "l40s", "tpu-v5e"]
SIZES = np.logspace(0, 13, 400)      # 1 B .. 10 TB
FLOPS = np.logspace(0, 16, 400)      # 1 FLOP .. 10 PFLOP


def test_required_devices_are_shipped():
    assert set(EXPECTED) <= set(hwmodels.list_devices())


@pytest.mark.parametrize("name", hwmodels.list_devices())
def test_every_shipped_file_loads_with_sources(name):
    device = load_device(name)
    assert device.name == name  # file stem and name field agree
    assert device.memory_bytes > 0 and device.memory_bw > 0
    assert device.launch_overhead_s > 0 and device.host_overhead_s > 0
    for field in ("memory_capacity", "memory_bandwidth", "launch_overhead", "host_overhead"):
        assert device.sources[field].strip()
    for dtype in device.flops:
        assert device.sources[f"peak_flops.{dtype}"].strip()
    assert any(k.startswith("bw_efficiency") for k in device.sources)
    assert any(k.startswith("compute_efficiency") for k in device.sources)
    json.dumps(device.to_dict())  # JSON-ready


@pytest.mark.parametrize("name", hwmodels.list_devices())
def test_efficiency_curves_in_unit_interval_and_monotone(name):
    device = load_device(name)
    for curve, sizes in ((device.bw_efficiency, SIZES), (device.compute_efficiency, FLOPS)):
        eff = curve(sizes)
        assert eff.shape == sizes.shape
        assert np.all(eff > 0) and np.all(eff <= 1)
        assert np.all(np.diff(eff) >= -1e-12)
        # A larger transfer / GEMM is never predicted to finish sooner.
        assert np.all(np.diff(sizes / eff) >= -1e-9 * (sizes / eff)[1:])
        assert 0 < float(curve(0.0)) <= 1  # zero-sized ops stay in range


def test_h200_datasheet_numbers():
    h200 = load_device("h200-sxm")
    assert h200.memory_bw == pytest.approx(4.8e12)
    assert h200.memory_bytes == pytest.approx(141 * 2**30)          # binary HBM capacity (141 GiB)
    assert h200.peak_flops("bf16") == pytest.approx(989.4e12)
    assert h200.peak_flops("fp8") == pytest.approx(1979e12)


@pytest.mark.parametrize("name, bw, bf16", [
    ("a100-40g-sxm", 1555e9, 312e12), ("a100-80g-sxm", 2039e9, 312e12), ("h100-sxm", 3.35e12, 989.4e12),
    ("mi300x", 5.3e12, 1307.4e12), ("l4", 300e9, 121e12), ("l40s", 864e9, 362.05e12),
    ("tpu-v5e", 819e9, 197e12), ("b200", 8e12, 2250e12), ("gh200", 4e12, 989.4e12), ("gh200-144g", 4.9e12, 989.4e12)])
def test_datasheet_bandwidth_and_dense_bf16(name, bw, bf16):
    device = load_device(name)
    assert device.memory_bw == pytest.approx(bw)
    assert device.peak_flops("bf16") == pytest.approx(bf16)   # dense, not the 2:4-sparse figure


def test_dense_peaks_never_sparse():
    # The sparse figure is exactly twice the dense one; no shipped bf16 peak may equal it.
    sparse_bf16 = {"a100-40g-sxm": 624e12, "h100-sxm": 1979e12, "h200-sxm": 1979e12, "mi300x": 2614.9e12,
                   "l4": 242e12, "l40s": 733e12, "b200": 4500e12, "gh200": 1979e12, "gh200-144g": 1979e12}
    for name, sparse in sparse_bf16.items():
        assert load_device(name).peak_flops("bf16") < 0.6 * sparse


def test_peak_flops_fallbacks():
    a100 = load_device("a100-40g-sxm")
    assert a100.peak_flops("fp8") == a100.peak_flops("bf16")      # no fp8 units
    assert a100.flops_dtype("fp8") == "bf16"
    assert a100.peak_flops("int4") == a100.peak_flops("int8")
    tpu = load_device("tpu-v5e")
    assert tpu.flops_dtype("fp32") == "bf16"                      # nothing wider: matrix rate
    assert tpu.flops_dtype("fp16") == "bf16"
    for name in hwmodels.list_devices():
        device = load_device(name)
        for dtype in DTYPES:
            assert device.peak_flops(dtype) > 0
    assert a100.peak_flops("bfloat16") == a100.peak_flops("bf16")  # aliases accepted
    with pytest.raises(ValueError, match="unknown dtype"):
        a100.peak_flops("fp64")


def test_efficiency_accepts_scalars_and_arrays():
    device = load_device("h100-sxm")
    scalar = device.bw_efficiency(1e6)
    assert np.ndim(scalar) == 0 and 0 < float(scalar) <= 1
    grid = np.full((3, 4), 1e6)
    assert device.bw_efficiency(grid).shape == (3, 4)
    assert np.allclose(device.bw_efficiency(grid), float(scalar))
    assert device.compute_efficiency([1e9, 1e12]).shape == (2,)


def test_efficiency_is_fast_enough_for_millions_of_points():
    device = load_device("h200-sxm")
    sizes = np.random.default_rng(0).uniform(1, 1e10, 1_000_000)
    start = time.perf_counter()
    device.bw_efficiency(sizes)
    device.compute_efficiency(sizes)
    assert time.perf_counter() - start < 1.0   # typically ~20 ms


def test_device_equality_follows_content(tmp_path):
    a = load_device("h200-sxm")
    assert a == load_device("h200-sxm") and hash(a) == hash(load_device("h200-sxm"))
    assert a != load_device("h100-sxm")
    copy = tmp_path / "copy.yaml"
    copy.write_text((hwmodels.DEVICES_DIR / "h200-sxm.yaml").read_text())
    assert load_device(copy) == a and load_device(str(copy)).source_path == str(copy)
    assert len({a, load_device(copy)}) == 1


def test_roofline_sanity_decode_floor():
    # Batch-1 decode floor for 13.48 GB of weights at peak bandwidth on H200: 2.81 ms.
    h200 = load_device("h200-sxm")
    assert 13.48e9 / h200.memory_bw == pytest.approx(2.81e-3, rel=0.01)
    assert math.isclose(h200.to_dict()["memory_bw"], 4.8e12)


def test_compute_curve_read_at_equal_time_at_peak_per_dtype():
    # The datasheet ramp (5 us at the bf16 peak) is a time: an fp32 kernel (1/16 of the A100's bf16
    # rate) with the same FLOPs spends 16x longer at peak, so it sits where a 16x larger bf16 one does.
    a100 = load_device("a100-80g-sxm")
    assert a100.compute_reference_dtype == "bf16"
    ratio = a100.peak_flops("bf16") / a100.peak_flops("fp32")
    flops = np.array([1e6, 1e8, 1e10])
    assert np.allclose(a100.compute_efficiency(flops, "fp32"), a100.compute_efficiency(flops * ratio))
    assert np.allclose(a100.compute_efficiency(flops, "bf16"), a100.compute_efficiency(flops))
    # no dtype: the sizes as given (backwards compatible)
    assert np.allclose(a100.compute_efficiency(flops), a100.compute_curve(flops))
    # time-at-peak of a tiny fp32 norm: ~ 5 us / 0.8 of ramp, not 5 us x 16
    t = 1e6 / (a100.peak_flops("fp32") * a100.compute_efficiency(1e6, "fp32"))
    assert t < 10e-6


@pytest.mark.parametrize("name", EXPECTED)
def test_datasheet_compute_curves_name_their_reference_dtype(name):
    device = load_device(name)
    assert device.compute_reference_dtype in device.flops
    assert device.to_dict()["compute_reference_dtype"] == device.compute_reference_dtype
