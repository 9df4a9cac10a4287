import numpy as np
import pytest

from hwmodels.curves import SaturatingCurve, TableCurve, check_table
from hwmodels.units import UnitError, format_quantity, to_base


def test_saturating_curve_shape():
    curve = SaturatingCurve(0.8, 2e6)
    assert float(curve(2e6)) == pytest.approx(0.4)       # half of the plateau at half_size
    assert float(curve(1e15)) == pytest.approx(0.8, rel=1e-6)
    sizes = np.logspace(0, 12, 50)
    times = sizes / curve(sizes)
    # time = (s + half) / max: a fixed ramp cost plus streaming
    assert np.allclose(times, (np.maximum(sizes, 1) + 2e6) / 0.8)


@pytest.mark.parametrize("max_fraction, half", [(0, 1), (1.1, 1), (0.5, 0), (0.5, -1), (0.5, float("inf"))])
def test_saturating_curve_rejects_bad_parameters(max_fraction, half):
    with pytest.raises(ValueError):
        SaturatingCurve(max_fraction, half)


def test_table_curve_hits_points_and_holds_ends():
    curve = TableCurve((1e3, 1e6, 1e9), (0.01, 0.5, 0.8))
    assert np.allclose(curve([1e3, 1e6, 1e9]), [0.01, 0.5, 0.8])
    assert np.allclose(curve([1.0, 1e12]), [0.01, 0.8])


def test_table_time_monotone_between_points_when_time_is_flat():
    # Measured time flat in size (latency-bound): fraction proportional to size. The log-log
    # interpolation keeps the predicted time flat between points instead of dipping.
    curve = TableCurve((1e3, 4e3), (0.1, 0.4))
    sizes = np.linspace(1e3, 4e3, 101)
    times = sizes / curve(sizes)
    assert np.allclose(times, times[0])


def test_check_table_limits():
    check_table([1, 2], [0.1, 0.2])           # exactly flat time is allowed
    with pytest.raises(ValueError, match="too steeply"):
        check_table([1, 2], [0.1, 0.21])
    with pytest.raises(ValueError, match="must not decrease"):
        check_table([1, 2], [0.2, 0.1])


@pytest.mark.parametrize("value, unit, kind, expected", [
    (4.8, "TB/s", "bandwidth", 4.8e12), (141, "GB", "size", 141e9), (80, "GiB", "size", 80 * 2**30),
    (989.4, "TFLOP/s", "ops_rate", 989.4e12), (394, "TOPS", "ops_rate", 394e12),
    (4, "us", "time", 4e-6), (4, "µs", "time", 4e-6), (2.5, "GFLOP", "ops", 2.5e9), (0.5, None, "fraction", 0.5),
])
def test_units_convert(value, unit, kind, expected):
    assert to_base(value, unit, kind) == pytest.approx(expected)


def test_unit_errors_name_the_kind():
    with pytest.raises(UnitError, match="is a size in bytes, not a bandwidth"):
        to_base(1, "GB", "bandwidth")
    with pytest.raises(UnitError, match="unknown unit"):
        to_base(1, "parsecs", "time")
    with pytest.raises(UnitError, match="missing unit"):
        to_base(1, None, "size")


def test_format_quantity():
    assert format_quantity(4.8e12, "bandwidth") == "4.8 TB/s"
    assert format_quantity(1979e12, "ops_rate") == "1979 TFLOP/s"
    assert format_quantity(4e-6, "time") == "4 us"
    assert format_quantity(141 * 2**30, "capacity") == "141 GiB"      # binary DRAM sizes read as such
    assert format_quantity(48e9, "capacity") == "48 GB"
