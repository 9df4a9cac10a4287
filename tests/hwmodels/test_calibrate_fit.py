"""The torch-free half of hwmodels.calibrate: plans, fitting, the written document."""
import numpy as np
import pytest

from hwmodels import load_device
from hwmodels.calibrate.document import Provenance, build_document, render, write_and_check
from hwmodels.calibrate.fit import (EAGER_SWITCH_FLOOR_S, Series, consistent_table, fit, isotonic_increasing,
                                    raw_efficiency)
from hwmodels.calibrate.plan import Plan, make_plan
from hwmodels.curves import SaturatingCurve, check_table

LAUNCH = 3e-6
BW = 20e9
PEAK = 200e9
BW_CURVE = SaturatingCurve(0.9, 1e6)
FLOP_CURVE = SaturatingCurve(0.95, 5e7)


def synthetic_series(noise=0.0, seed=0):
    """Timings generated from the simulator's own op model with known parameters."""
    rng = np.random.default_rng(seed)
    jitter = lambda: 1 + noise * rng.standard_normal()  # noqa: E731
    s = {name: Series(name, "synthetic", kind) for name, kind in (
        ("dispatch", "calls"), ("host_step", "calls"), ("read", "bytes"), ("copy", "bytes"),
        ("gemv_fp32", "bytes"), ("gemm_fp32", "flops"), ("gemm_bf16", "flops"))}
    s["dispatch"].add(1, LAUNCH)
    s["host_step"].add(1, 50e-6)
    for nbytes in 4.0 ** np.arange(8, 16):
        s["read"].add(nbytes, (nbytes / (BW * float(BW_CURVE(nbytes))) + LAUNCH) * jitter())
        s["copy"].add(2 * nbytes, (2 * nbytes / (0.8 * BW) + LAUNCH) * jitter())
        s["gemv_fp32"].add(nbytes, (nbytes / (BW * float(BW_CURVE(nbytes))) + LAUNCH) * jitter())
    for n in (64, 128, 256, 512, 1024, 2048):
        flops = 2.0 * n**3
        s["gemm_fp32"].add(flops, (flops / (PEAK * float(FLOP_CURVE(flops))) + LAUNCH) * jitter())
        s["gemm_bf16"].add(flops, flops / (4 * PEAK) + LAUNCH)
    return s


def test_isotonic_increasing():
    assert np.allclose(isotonic_increasing([1, 3, 2, 4]), [1, 2.5, 2.5, 4])
    assert np.allclose(isotonic_increasing([5, 4, 3]), [4, 4, 4])
    values = np.random.default_rng(1).random(50)
    fitted = isotonic_increasing(values)
    assert np.all(np.diff(fitted) >= -1e-12)
    assert fitted.mean() == pytest.approx(values.mean())   # PAVA preserves the mean


def test_raw_efficiency_inverts_the_op_model():
    sizes = np.array([1e4, 1e6, 1e8])
    times = sizes / (BW * 0.5) + LAUNCH
    assert np.allclose(raw_efficiency(sizes, times, BW, LAUNCH), 0.5)
    # faster than peak after subtracting the overhead: capped at 1
    assert raw_efficiency([1e4], [1e-9], BW, LAUNCH)[0] == pytest.approx(1.0)


def test_consistent_table_repairs_noisy_measurements():
    sizes = [1e3, 4e3, 16e3, 64e3, 256e3]
    noisy = [0.02, 0.015, 0.3, 0.9, 0.85]      # dip, then a jump steeper than size
    out_sizes, out_fractions = consistent_table(sizes, noisy)
    check_table(out_sizes, out_fractions)
    assert all(isinstance(s, int) for s in out_sizes)
    assert out_fractions[1] <= out_fractions[0] * 4 + 1e-12


def test_fit_recovers_known_parameters():
    result = fit(synthetic_series(), "fp32")
    assert result.launch_overhead_s == pytest.approx(LAUNCH)
    assert result.host_overhead_s == pytest.approx(50e-6)
    # the best read rate is at the largest size: close to 0.9 * BW
    assert result.memory_bw == pytest.approx(BW * float(BW_CURVE(4.0**15)) /
                                             (1 + LAUNCH * BW * float(BW_CURVE(4.0**15)) / 4.0**15), rel=1e-6)
    # the fitted curve reproduces the measured GEMV times through the op model
    gemv = synthetic_series()["gemv_fp32"]
    predicted = gemv.sizes() / (result.memory_bw * result.bw_table(gemv.sizes())) + result.launch_overhead_s
    assert np.allclose(predicted, gemv.seconds(), rtol=1e-3)
    gemm = synthetic_series()["gemm_fp32"]
    predicted = gemm.sizes() / (result.flops["fp32"] * result.compute_table(gemm.sizes())) + LAUNCH
    assert np.allclose(predicted, gemm.seconds(), rtol=1e-3)
    assert result.flops["bf16"] > 3 * result.flops["fp32"]
    assert "gemm_bf16" in result.flops_from["bf16"]


def test_fit_with_noise_still_gives_valid_curves():
    for seed in range(5):
        result = fit(synthetic_series(noise=0.3, seed=seed), "fp32")
        check_table(result.bw_table.sizes, result.bw_table.fractions)
        check_table(result.compute_table.sizes, result.compute_table.fractions)


def test_fit_requires_the_core_series():
    series = synthetic_series()
    del series["gemv_fp32"]
    with pytest.raises(ValueError, match="gemv_fp32"):
        fit(series, "fp32")


def provenance(**changes):
    values = dict(device="cpu", mode="quick", host="testhost", date="2026-01-01T00:00:00Z",
                  omp_wait_policy="ACTIVE", torch_version="2.13.0", threads=2, repeats=3,
                  timer="test timer", wall_time_s=1.5, load_before=[0.1, 0.1, 0.1],
                  load_after=[0.2, 0.1, 0.1], llc_bytes=2**20, pool_bytes=2**24, settings={"cpu": "x"},
                  python_version="3.11", numpy_version="2")
    values.update(changes)
    return Provenance(**values)


def test_document_round_trips_through_the_loader(tmp_path):
    series = synthetic_series(noise=0.1)
    result = fit(series, "fp32")
    doc = build_document("test-cpu", "synthetic device", 16e9, "test", result, series, provenance(), "fp32")
    device = write_and_check(tmp_path / "test-cpu.yaml", doc)
    assert device.name == "test-cpu"
    assert device.memory_bw == pytest.approx(result.memory_bw, rel=1e-3)
    assert device.peak_flops("fp32") == pytest.approx(result.flops["fp32"], rel=1e-3)
    assert device.peak_flops("fp16") == device.peak_flops("bf16")   # fallback for unmeasured
    assert device.launch_overhead_s == pytest.approx(LAUNCH, rel=1e-3)
    assert device.compute_reference_dtype == "fp32"     # the GEMM series' dtype: the curve's size axis
    for field, source in device.sources.items():
        assert source.startswith("measured: hwmodels.calibrate --quick on testhost"), field
        assert "OMP_WAIT_POLICY=ACTIVE" in source and "torch 2.13.0" in source and "median" in source
    assert device.calibration["wall_time_s"] == 1.5
    assert device.calibration["env"]["OMP_WAIT_POLICY"] == "ACTIVE"
    assert set(device.calibration["series"]) == set(series)
    assert not (tmp_path / "test-cpu.yaml.tmp").exists()   # written via tmp + os.replace
    assert render(doc).startswith("# Calibrated hardware file")


def test_contention_is_flagged_in_the_notes():
    series = synthetic_series()
    result = fit(series, "fp32")
    busy = build_document("x", "d", 1e9, "t", result, series, provenance(load_before=[9.8, 8, 7]), "fp32")
    quiet = build_document("x", "d", 1e9, "t", result, series, provenance(), "fp32")
    assert "CPU contention (load average 9.8" in busy["notes"]
    assert "contention" not in quiet["notes"]
    # a caller's own busy thread (traces.timing --calibrate) is not contention, and is recorded
    own = build_document("x", "d", 1e9, "t", result, series, provenance(load_before=[1.2, 1, 1], own_load=1.0),
                         "fp32")
    assert "contention" not in own["notes"] and own["calibration"]["load_average"]["own_threads"] == 1.0
    others = build_document("x", "d", 1e9, "t", result, series, provenance(load_before=[1.8, 1, 1], own_load=1.0),
                            "fp32")
    assert "load average 1.8 at start, 1 of it the calibrating process's own threads" in others["notes"]
    assert "own_threads" not in quiet["calibration"]["load_average"]


def test_full_mode_source_has_no_quick_marker():
    assert "--quick" not in provenance(mode="full").source("x")


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("quick", [True, False])
def test_shipped_plans_are_valid(device, quick):
    plan = make_plan(device, quick)
    assert plan.device == device and plan.mode == ("quick" if quick else "full")
    assert plan.n_points() > 10
    if not quick:
        assert plan.stream_sizes[0] == 64 * 2**10 and plan.stream_sizes[-1] >= 2**30
        assert plan.repeats >= 5
    if device == "cuda" and not quick:
        assert max(plan.gemm_sizes["bf16"]) >= 8192 and plan.primary_dtype == "bf16"


def test_plan_validation():
    good = make_plan("cpu", True)
    kwargs = dict(device="cpu", mode="quick", stream_sizes=good.stream_sizes, gemv_dtypes=("fp32",),
                  gemm_sizes={"fp32": (32, 64)}, primary_dtype="fp32", pool_bytes=good.pool_bytes,
                  repeats=3, min_sample_s=1e-3)
    Plan(**kwargs)
    for bad in (dict(device="tpu"), dict(stream_sizes=(4096, 1024)), dict(repeats=1),
                dict(primary_dtype="bf16"), dict(gemm_sizes={"fp64": (32,)}),
                dict(pool_bytes=1024), dict(min_sample_s=0)):
        with pytest.raises(ValueError):
            Plan(**{**kwargs, **bad})
    assert good.gemv_shape(4 * 2**20, "fp32") == 1024
    assert good.gemv_shape(2 * 2**20, "bf16") == 1024


def test_written_file_can_be_loaded_by_name_from_path(tmp_path):
    series = synthetic_series()
    doc = build_document("x-local", "d", 1e9, "test", fit(series, "fp32"), series, provenance(), "fp32")
    path = tmp_path / "x-local.yaml"
    write_and_check(path, doc)
    assert load_device(str(path)).name == "x-local"


def test_fit_rows_from_skinny_series(tmp_path):
    # skinny GEMMs timed as max(stream the weight, FLOPs at a row-dependent rate): the fit returns
    # the rate per row count as a fraction of the fp32 peak (median over sides), and the file loads.
    series = synthetic_series()
    rate = {1: 0.02, 2: 0.04, 4: 0.06, 8: 0.1, 16: 0.2}
    for n in (1024, 2048):
        s = series[f"skinny_fp32_n{n}"] = Series(f"skinny_fp32_n{n}", "synthetic", "rows")
        for m, frac in rate.items():
            s.add(m, max(n * n * 4 / BW, 2 * m * n * n / (PEAK * frac)) + LAUNCH)
    result = fit(series, "fp32")
    peak = result.flops["fp32"]
    assert result.rows_table.sizes == (1, 2, 4, 8, 16)
    for m, frac in rate.items():
        expect = max(2 * m * 2048**2 / (peak * max(2048**2 * 4 / BW, 2 * m * 2048**2 / (PEAK * frac))),
                     2 * m * 1024**2 / (peak * max(1024**2 * 4 / BW, 2 * m * 1024**2 / (PEAK * frac))))
        assert float(result.rows_table(m)) <= expect * 1.001
    assert result.rows_in_out_table is None          # no [in, out] series: no such table (in_out reads the other)
    doc = build_document("rows-cpu", "d", 1e9, "test", result, series, provenance(), "fp32")
    device = write_and_check(tmp_path / "rows-cpu.yaml", doc)
    assert np.allclose(device.gemm_rows_efficiency([1, 16]), result.rows_table([1, 16]))
    assert np.allclose(device.gemm_rows_efficiency([1, 16], in_out=True), result.rows_table([1, 16]))  # fallback
    # an [in, out] series twice as fast per row count: its own table, read for in_out GEMMs only
    for n in (1024, 2048):
        s = series[f"skinny_io_fp32_n{n}"] = Series(f"skinny_io_fp32_n{n}", "synthetic", "rows")
        for m, frac in rate.items():
            s.add(m, max(n * n * 4 / BW, 2 * m * n * n / (PEAK * 2 * frac)) + LAUNCH)
    both = fit(series, "fp32")
    device = write_and_check(tmp_path / "rows-io-cpu.yaml", build_document(
        "rows-io-cpu", "d", 1e9, "test", both, series, provenance(), "fp32"))
    assert np.allclose(device.gemm_rows_efficiency([1, 16]), both.rows_table([1, 16]))
    assert np.allclose(device.gemm_rows_efficiency([1, 16], in_out=True), both.rows_in_out_table([1, 16]))
    assert float(both.rows_in_out_table(16)) > float(both.rows_table(16))
    # without skinny series: no table, and the device reports none
    plain = fit(synthetic_series(), "fp32")
    assert plain.rows_table is None
    assert load_device(write_and_check(tmp_path / "plain.yaml", build_document(
        "plain", "d", 1e9, "t", plain, synthetic_series(), provenance(), "fp32")).source_path
    ).gemm_rows_efficiency(4) is None


def test_eager_call_overhead_is_written_only_when_measured(tmp_path):
    series = synthetic_series()
    plain = write_and_check(tmp_path / "plain.yaml", build_document(
        "test-cpu", "synthetic device", 16e9, "test", fit(series, "fp32"), series, provenance(), "fp32"))
    assert plain.tables.eager_call_overhead_s is None and "eager_call_overhead" not in plain.sources
    series["eager_call"] = Series("eager_call", "synthetic decoder layers", "calls", [(55.0, 55 * 3.5e-6)])
    result = fit(series, "fp32")
    assert result.eager_call_overhead_s == pytest.approx(3.5e-6)
    doc = build_document("test-cpu", "synthetic device", 16e9, "test", result, series, provenance(), "fp32")
    assert doc["eager_call_overhead"]["unit"] == "us" and doc["eager_call_overhead"]["value"] == 3.5
    device = write_and_check(tmp_path / "eager.yaml", doc)
    assert device.tables.eager_call_overhead_s == pytest.approx(3.5e-6)
    assert device.launch_overhead_s == pytest.approx(LAUNCH)        # the dispatch figure is untouched
    assert "eager_call: synthetic decoder layers" in device.sources["eager_call_overhead"]
    assert device.calibration["series"]["eager_call"]["points_size_seconds"] == [[55, pytest.approx(1.925e-4)]]


def test_eager_weight_switch_is_the_streamed_stack_minus_the_plain_one_per_weight(tmp_path):
    series = synthetic_series()
    series["eager_call"] = Series("eager_call", "synthetic decoder layers", "calls", [(55.0, 200e-6)])
    assert fit(series, "fp32").eager_switch_s is None          # no streaming series: not measured
    series["eager_stream"] = Series("eager_stream", "the same, weights streamed", "calls", [(7.0, 900e-6)])
    result = fit(series, "fp32")
    assert result.eager_switch_s == pytest.approx(100e-6)      # (900 - 200) us per layer / 7 weights
    doc = build_document("test-cpu", "synthetic device", 16e9, "test", result, series, provenance(), "fp32")
    assert doc["eager_weight_switch_overhead"]["value"] == pytest.approx(100.0)
    device = write_and_check(tmp_path / "switch.yaml", doc)
    assert device.tables.eager_weight_switch_s == pytest.approx(100e-6)
    # a streamed stack measured faster than the plain one (noise) is no negative cost: bounded at a tiny
    # positive floor with a warning, so the file stays valid (the schema wants a positive value)
    series["eager_stream"] = Series("eager_stream", "the same, weights streamed", "calls", [(7.0, 150e-6)])
    bounded = fit(series, "fp32")
    assert bounded.eager_switch_s == EAGER_SWITCH_FLOOR_S and result.warnings == ()
    assert len(bounded.warnings) == 1 and "eager_weight_switch_overhead came out -7.14 us" in bounded.warnings[0]
    doc = build_document("test-cpu", "synthetic device", 16e9, "test", bounded, series, provenance(), "fp32")
    assert write_and_check(tmp_path / "bounded.yaml", doc).tables.eager_weight_switch_s == pytest.approx(1e-9)
