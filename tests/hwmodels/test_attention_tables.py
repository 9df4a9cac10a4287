"""Attention KV-stream tables: schema, Device factors, calibration fit and benchmarks."""
import importlib.util
import math

import numpy as np
import pytest
import yaml

from hwmodels import load_device
from hwmodels.calibrate.document import build_document, write_and_check
from hwmodels.calibrate.fit import Series, fit
from hwmodels.calibrate.fit import round_fraction
from hwmodels.calibrate.plan import Plan, make_plan

from .test_calibrate_fit import LAUNCH, provenance, synthetic_series
from .test_schema_errors import edit, expect_error

KEYS = ("attn_scores_efficiency", "attn_values_efficiency")


def table(points, unit="head_dim"):
    return {"form": "table", "size_unit": unit, "points": points, "source": "test"}


def with_tables(h200_text, tmp_path, scores, values=None, name="dev.yaml"):
    def mutate(d):
        d["attn_scores_efficiency"] = scores
        if values is not None:
            d["attn_values_efficiency"] = values
    path = edit(h200_text, tmp_path, mutate)
    return path.rename(path.with_name(name))


# ---------------------------------------------------------------------------------------------------
# Schema and Device

def test_files_without_tables_have_unit_factors():
    device = load_device("h200-sxm")
    assert device.attn_scores_factor(128) == 1.0 and device.attn_values_factor(64) == 1.0
    assert np.array_equal(device.attn_scores_factor([64, 128]), [1.0, 1.0])
    assert device.to_dict()["attn_scores_efficiency"] is None


def test_factor_interpolates_over_head_width_and_holds_at_the_ends(h200_text, tmp_path):
    path = with_tables(h200_text, tmp_path, table([[64, 0.5], [128, 0.8]]), table([[64, 0.9]]))
    device = load_device(path)
    assert device.attn_scores_factor(64) == pytest.approx(0.5)
    assert device.attn_scores_factor(128) == pytest.approx(0.8)
    # log-log between points (TableCurve): 0.5 * (0.8/0.5) ** log2(96/64)
    assert device.attn_scores_factor(96) == pytest.approx(0.5 * 1.6 ** math.log2(1.5))
    assert device.attn_scores_factor(32) == pytest.approx(0.5)     # held below the table
    assert device.attn_scores_factor(256) == pytest.approx(0.8)    # and above it
    assert isinstance(device.attn_scores_factor(80), float)
    assert device.attn_values_factor(256) == pytest.approx(0.9)    # one point: constant
    assert device.to_dict()["attn_scores_efficiency"]["points"] == [[64.0, 0.5], [128.0, 0.8]]


def test_a_factor_may_fall_with_head_width(h200_text, tmp_path):
    # a factor per width, not a size curve: the larger-is-never-faster checks do not apply
    device = load_device(with_tables(h200_text, tmp_path, table([[64, 0.9], [128, 0.6], [256, 0.65]])))
    assert device.attn_scores_factor(128) == pytest.approx(0.6)


def test_tables_change_the_content_hash(h200_text, tmp_path):
    plain = load_device(edit(h200_text, tmp_path, lambda d: None))
    tabled = load_device(with_tables(h200_text, tmp_path, table([[64, 0.5]]), name="t.yaml"))
    assert plain.content_hash != tabled.content_hash and plain != tabled


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("bad, fragments", [
    (table([[64, 1.2]]), (".points", "(0, 1]")),
    (table([[64, 0.0]]), (".points[0]", "positive")),
    (table([[128, 0.5], [64, 0.6]]), (".points", "strictly increasing")),
    (table([[-64, 0.5]]), (".points[0]", "positive")),
    (table([[64, 0.5]], unit="rows"), (".size_unit", "head width")),
    (table([[64, 0.5]], unit="B"), (".size_unit", "head width")),
    (table([]), (".points", "list")),
    ({"form": "table", "size_unit": "head_dim", "points": [[64, 0.5]]}, (".source", "missing")),
    ({"form": "saturating", "max_fraction": {"value": 0.5, "source": "x"}, "half_size": {"value": 64, "unit": "head_dim", "source": "x"}},
     None),
])
def test_bad_tables_give_one_line_naming_the_field(h200_text, tmp_path, key, bad, fragments):
    path = edit(h200_text, tmp_path, lambda d: d.update({key: bad}))
    if fragments is None:      # the saturating form is accepted too (same curve machinery)
        assert load_device(path).attn_scores_factor(64) > 0
        return
    expect_error(path, key + fragments[0], *fragments[1:])


# ---------------------------------------------------------------------------------------------------
# Calibration fit (torch-free)

def add_attention(series, result, fractions):
    """Attention series timed as the fitted streaming curve slowed by known fractions per size."""
    for name, per_size in fractions.items():
        s = series[name] = Series(name, "synthetic", "bytes")
        for nbytes, frac in per_size.items():
            s.add(nbytes, nbytes / (result.memory_bw * float(result.bw_table(nbytes)) * frac) + LAUNCH)
    return series


SIZES = (4 * 2**20, 16 * 2**20, 64 * 2**20)


def test_fit_attention_takes_the_median_fraction_per_width(tmp_path):
    base = fit(synthetic_series(), "fp32")
    series = add_attention(synthetic_series(), base, {
        "attn_scores_fp32_d64": dict(zip(SIZES, (0.5, 0.7123456, 0.9))),   # median 0.7123456
        "attn_scores_fp32_d128": dict(zip(SIZES, (0.9876543, 0.95, 0.99))),
        "attn_values_fp32_d64": dict(zip(SIZES, (1.3, 1.5, 1.2))),        # faster than the curve: capped
        "attn_values_fp32_d128": dict(zip(SIZES, (0.8, 0.8123456, 0.83))),
        "attn_values_bf16_d64": dict(zip(SIZES, (0.1, 0.1, 0.1))),        # not the primary dtype: ignored
    })
    result = fit(series, "fp32")
    assert result.memory_bw == base.memory_bw            # attention series do not set the bandwidth
    scores, values = result.attention["scores"].curve, result.attention["values"].curve
    assert scores.sizes == (64, 128) and values.sizes == (64, 128)
    assert scores.fractions == (0.71234, 0.98765)
    assert values.fractions == (1.0, 0.81234)
    assert result.attention["scores"].series == "attn_scores_fp32_d64, attn_scores_fp32_d128"

    doc = build_document("attn-cpu", "d", 1e9, "test", result, series, provenance(), "fp32")
    assert doc["attn_scores_efficiency"]["points"] == [[64, 0.71234], [128, 0.98765]]
    assert doc["attn_scores_efficiency"]["size_unit"] == "head_dim"
    assert doc["calibration"]["series"]["attn_scores_fp32_d64"]["size"] == "bytes"
    device = write_and_check(tmp_path / "attn-cpu.yaml", doc)
    assert device.attn_scores_factor(64) == pytest.approx(0.71234)
    assert device.attn_values_factor(128) == pytest.approx(0.81234)
    assert device.sources["attn_values_efficiency"].startswith("measured: hwmodels.calibrate --quick")


def test_no_attention_series_no_tables(tmp_path):
    result = fit(synthetic_series(), "fp32")
    assert result.attention == {}
    doc = build_document("x", "d", 1e9, "t", result, synthetic_series(), provenance(), "fp32")
    assert not set(KEYS) & set(doc)


def test_round_fraction():
    assert round_fraction(0.123456789) == 0.12345
    assert round_fraction(1.7) == 1.0
    assert round_fraction(1e-9) == 1e-5


# ---------------------------------------------------------------------------------------------------
# Plans and benchmarks

def test_plans_measure_the_head_widths():
    assert make_plan("cpu", False).attn_head_dims == (64, 128)
    assert make_plan("cpu", True).attn_head_dims == (64,)
    assert make_plan("cuda", False).attn_head_dims == (64, 128)
    assert make_plan("cuda", True).attn_head_dims == ()
    full = make_plan("cpu", False)
    assert [full.attn_heads * full.attn_seq_len(b, 64) * 64 * 4 for b in full.attn_kv_bytes] == \
        [4 * 2**20, 16 * 2**20, 64 * 2**20]


def test_plan_rejects_bad_attention_settings():
    good = make_plan("cpu", True)
    kwargs = dict(device="cpu", mode="quick", stream_sizes=good.stream_sizes, gemv_dtypes=("fp32",),
                  gemm_sizes={"fp32": (32, 64)}, primary_dtype="fp32", pool_bytes=good.pool_bytes,
                  repeats=3, min_sample_s=1e-3, attn_head_dims=(64,), attn_kv_bytes=(2**20,))
    Plan(**kwargs)
    for bad in (dict(attn_head_dims=(128, 64)), dict(attn_head_dims=(0,)), dict(attn_heads=0),
                dict(attn_kv_bytes=(2**30,)), dict(attn_kv_bytes=(2**20, 2**19)), dict(attn_kv_bytes=(16,))):
        with pytest.raises(ValueError):
            Plan(**{**kwargs, **bad})


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_benchmarks_write_tables_that_load(tmp_path):
    from hwmodels.calibrate.bench import run_all

    from .test_calibrate_bench import ScriptedTimer
    plan = Plan("cpu", "quick", (64 * 2**10, 256 * 2**10), ("fp32",), {"fp32": (16, 32)}, "fp32",
                pool_bytes=2**20, repeats=3, min_sample_s=1e-4, attn_head_dims=(16, 32),
                attn_kv_bytes=(64 * 2**10, 128 * 2**10), attn_heads=4)
    labels = []
    series = run_all(plan, labels.append, timer=ScriptedTimer(5e-6))
    assert len(labels) == plan.n_points()
    names = {"attn_scores_fp32_d16", "attn_scores_fp32_d32", "attn_values_fp32_d16", "attn_values_fp32_d32"}
    assert names <= set(series)
    assert all(series[n].size_kind == "bytes" for n in names)
    assert [p[0] for p in series["attn_values_fp32_d32"].points] == [64 * 2**10, 128 * 2**10]
    result = fit(series, "fp32")
    assert result.attention["scores"].curve.sizes == (16, 32)
    device = write_and_check(tmp_path / "b.yaml", build_document("b", "d", 1e9, "t", result, series,
                                                                 provenance(), "fp32"))
    assert 0 < device.attn_scores_factor(16) <= 1 and 0 < device.attn_values_factor(32) <= 1
    written = yaml.safe_load((tmp_path / "b.yaml").read_text())
    assert [p[0] for p in written["attn_values_efficiency"]["points"]] == [16, 32]


# ---------------------------------------------------------------------------------------------------
# SDPA's decode kernel: a compute rate per (query head, key)

def test_sdpa_series_fit_a_rate_per_query_head_key_and_the_device_reads_it(tmp_path):
    from hwmodels.calibrate.fit_attention import sdpa_flops_per_key
    series = synthetic_series()
    peak = fit(series, "fp32").flops["fp32"]
    for d, frac in ((64, 0.05), (128, 0.08)):
        s = series[f"sdpa_core_fp32_d{d}"] = Series(f"sdpa_core_fp32_d{d}", "synthetic", "keys")
        for keys in (4096, 8192, 16384):
            s.add(keys, sdpa_flops_per_key(d) * keys / (peak * frac) + LAUNCH)
    result = fit(series, "fp32")
    table = result.attention["sdpa"].curve
    assert table.sizes == (64, 128)
    assert table.fractions == pytest.approx((0.05, 0.08), abs=2e-3)
    device = write_and_check(tmp_path / "sdpa.yaml", build_document(
        "sdpa-cpu", "d", 1e9, "test", result, series, provenance(), "fp32"))
    assert device.tables.sdpa_decode_efficiency(64) == pytest.approx(0.05, abs=2e-3)
    assert load_device("h200-sxm").tables.sdpa_decode_efficiency(64) is None      # datasheet files: none
    assert "sdpa_decode_efficiency" not in build_document(
        "plain", "d", 1e9, "t", fit(synthetic_series(), "fp32"), synthetic_series(), provenance(), "fp32")
