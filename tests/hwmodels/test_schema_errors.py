"""Every kind of bad hardware file gives one HardwareFileError line naming file and field."""
import pytest
import yaml

import hwmodels
from hwmodels import HardwareFileError, load_device


def write(tmp_path, text, name="dev.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def edit(h200_text, tmp_path, mutate):
    data = yaml.safe_load(h200_text)
    mutate(data)
    return write(tmp_path, yaml.safe_dump(data, sort_keys=False))


def expect_error(path_or_name, field_fragment, *more):
    with pytest.raises(HardwareFileError) as info:
        load_device(path_or_name)
    message = str(info.value)
    assert isinstance(info.value, ValueError)
    assert "\n" not in message
    assert str(path_or_name) in message
    if field_fragment:
        assert field_fragment in message, message
    for fragment in more:
        assert fragment in message, message
    return message


def test_unknown_top_level_key(h200_text, tmp_path):
    path = edit(h200_text, tmp_path, lambda d: d.update(l2_cache={"value": 50, "unit": "MB", "source": "x"}))
    expect_error(path, "l2_cache", "unknown field")


def test_unknown_nested_key(h200_text, tmp_path):
    path = edit(h200_text, tmp_path, lambda d: d["memory_bandwidth"].update(sustained=4.3))
    expect_error(path, "memory_bandwidth.sustained", "unknown field")


@pytest.mark.parametrize("field", ["memory_bandwidth", "peak_flops", "launch_overhead", "bw_efficiency"])
def test_missing_field(h200_text, tmp_path, field):
    path = edit(h200_text, tmp_path, lambda d: d.pop(field))
    expect_error(path, field, "missing")


def test_missing_source(h200_text, tmp_path):
    path = edit(h200_text, tmp_path, lambda d: d["peak_flops"]["bf16"].pop("source"))
    expect_error(path, "peak_flops.bf16.source", "missing")


@pytest.mark.parametrize("value", [0, -4.8])
def test_zero_or_negative_value(h200_text, tmp_path, value):
    path = edit(h200_text, tmp_path, lambda d: d["memory_bandwidth"].update(value=value))
    expect_error(path, "memory_bandwidth.value", "positive")


def test_negative_curve_parameter(h200_text, tmp_path):
    path = edit(h200_text, tmp_path, lambda d: d["bw_efficiency"]["half_size"].update(value=-1))
    expect_error(path, "bw_efficiency.half_size.value", "positive")


def test_value_not_a_number(h200_text, tmp_path):
    path = edit(h200_text, tmp_path, lambda d: d["memory_capacity"].update(value="141"))
    expect_error(path, "memory_capacity.value", "expected a number")


@pytest.mark.parametrize("unit, fragment", [
    ("GB", "is a size in bytes, not a bandwidth"),
    ("TFLOP/s", "is a rate of operations, not a bandwidth"),
    ("furlongs/fortnight", "unknown unit"),
])
def test_wrong_unit_for_bandwidth(h200_text, tmp_path, unit, fragment):
    path = edit(h200_text, tmp_path, lambda d: d["memory_bandwidth"].update(unit=unit))
    expect_error(path, "memory_bandwidth.unit", fragment)


def test_wrong_unit_for_capacity_and_time(h200_text, tmp_path):
    path = edit(h200_text, tmp_path, lambda d: d["memory_capacity"].update(unit="GB/s"))
    expect_error(path, "memory_capacity.unit", "not a size")
    path = edit(h200_text, tmp_path, lambda d: d["launch_overhead"].update(unit="MB"))
    expect_error(path, "launch_overhead.unit", "not a time")


def test_missing_unit(h200_text, tmp_path):
    path = edit(h200_text, tmp_path, lambda d: d["memory_bandwidth"].pop("unit"))
    expect_error(path, "memory_bandwidth.unit", "missing")


def test_binary_units_are_accepted(h200_text, tmp_path):
    path = edit(h200_text, tmp_path, lambda d: d["memory_capacity"].update(value=80, unit="GiB"))
    assert load_device(path).memory_bytes == 80 * 2**30


def test_unknown_dtype_in_peak_flops(h200_text, tmp_path):
    path = edit(h200_text, tmp_path, lambda d: d["peak_flops"].update(fp64={"value": 34, "unit": "TFLOP/s",
                                                                            "source": "x"}))
    expect_error(path, "peak_flops.fp64", "unknown dtype")


def test_fraction_above_one(h200_text, tmp_path):
    path = edit(h200_text, tmp_path, lambda d: d["bw_efficiency"]["max_fraction"].update(value=1.2))
    expect_error(path, "bw_efficiency.max_fraction.value", "(0, 1]")


def test_unknown_curve_form(h200_text, tmp_path):
    path = edit(h200_text, tmp_path, lambda d: d["compute_efficiency"].update(form="spline"))
    expect_error(path, "compute_efficiency.form", "saturating or table")


def table(points, unit="B"):
    return {"form": "table", "size_unit": unit, "points": points, "source": "test"}


def test_table_curve_loads_and_interpolates(h200_text, tmp_path):
    path = edit(h200_text, tmp_path, lambda d: d.update(bw_efficiency=table([[1, 0.1], [100, 0.5]], "MB")))
    device = load_device(path)
    assert float(device.bw_efficiency(1e6)) == pytest.approx(0.1)
    assert float(device.bw_efficiency(1e8)) == pytest.approx(0.5)
    assert float(device.bw_efficiency(1e7)) == pytest.approx((0.1 * 0.5) ** 0.5)  # log-log midpoint
    assert float(device.bw_efficiency(1e12)) == pytest.approx(0.5)               # held beyond the ends


@pytest.mark.parametrize("points, fragment", [
    ([[1, 0.5], [10, 0.3]], "must not decrease"),
    ([[1, 0.01], [2, 0.5]], "too steeply"),
    ([[10, 0.1], [1, 0.2]], "strictly increasing"),
    ([[1, 0.1], [10, 1.5]], "(0, 1]"),
    ([], "expected a list"),
])
def test_bad_table(h200_text, tmp_path, points, fragment):
    path = edit(h200_text, tmp_path, lambda d: d.update(bw_efficiency=table(points)))
    expect_error(path, "bw_efficiency.points", fragment)


def test_table_with_wrong_size_unit(h200_text, tmp_path):
    path = edit(h200_text, tmp_path, lambda d: d.update(compute_efficiency=table([[1, 0.5]], "GB")))
    expect_error(path, "compute_efficiency.size_unit", "not an operation count")


def test_unparsable_yaml(tmp_path):
    path = write(tmp_path, "name: x\nmemory_bandwidth: {value: 1, unit: [\n")
    expect_error(path, None, "not valid YAML", "line")


def test_duplicate_key(h200_text, tmp_path):
    path = write(tmp_path, h200_text + "name: again\n")
    expect_error(path, None, "duplicate key 'name'")


def test_not_a_mapping(tmp_path):
    expect_error(write(tmp_path, "- a\n- b\n"), None, "mapping")
    expect_error(write(tmp_path, "", "empty.yaml"), None, "mapping")


def test_missing_file(tmp_path):
    expect_error(tmp_path / "nope.yaml", None, "file not found")


def test_unknown_device_name():
    message = expect_error("h300-sxm", None, "unknown device name")
    assert "h200-sxm" in message  # lists what exists


def test_wrong_schema_version(h200_text, tmp_path):
    path = edit(h200_text, tmp_path, lambda d: d.update(schema_version=2))
    expect_error(path, "schema_version", "unsupported")


def test_error_attributes(h200_text, tmp_path):
    path = edit(h200_text, tmp_path, lambda d: d["memory_bandwidth"].update(unit="GB"))
    with pytest.raises(HardwareFileError) as info:
        load_device(path)
    assert info.value.path == str(path) and info.value.field == "memory_bandwidth.unit"


def test_edited_file_is_reloaded(h200_text, tmp_path):
    path = write(tmp_path, h200_text)
    first = load_device(path)
    data = yaml.safe_load(h200_text)
    data["memory_bandwidth"]["value"] = 5.0
    path.write_text(yaml.safe_dump(data, sort_keys=False) + "# edited\n")
    second = load_device(path)
    assert second.memory_bw == 5e12 and second.content_hash != first.content_hash
    assert hwmodels.load_device(second) is second


def test_compute_reference_dtype_must_be_a_listed_peak(h200_text, tmp_path):
    path = edit(h200_text, tmp_path, lambda d: d["compute_efficiency"].update(reference_dtype="int4"))
    expect_error(path, "compute_efficiency.reference_dtype", "peak_flops")


def test_reference_dtype_only_on_the_compute_curve(h200_text, tmp_path):
    path = edit(h200_text, tmp_path, lambda d: d["bw_efficiency"].update(reference_dtype="bf16"))
    expect_error(path, "bw_efficiency.reference_dtype", "unknown field")


def test_compute_reference_dtype_optional(h200_text, tmp_path):
    path = edit(h200_text, tmp_path, lambda d: d["compute_efficiency"].pop("reference_dtype"))
    device = load_device(path)
    assert device.compute_reference_dtype is None
    assert device.compute_efficiency(1e9, "fp32") == device.compute_efficiency(1e9)


def test_eager_call_overhead_is_optional_and_read_as_a_time(h200_text, tmp_path):
    assert load_device(write(tmp_path, h200_text, "plain.yaml")).tables.eager_call_overhead_s is None
    path = edit(h200_text, tmp_path, lambda d: d.update(
        eager_call_overhead={"value": 3.5, "unit": "us", "source": "eager_call benchmark"}))
    device = load_device(path)
    assert device.tables.eager_call_overhead_s == pytest.approx(3.5e-6)
    assert device.sources["eager_call_overhead"] == "eager_call benchmark"
    assert device.to_dict()["eager_call_overhead_s"] == pytest.approx(3.5e-6)


@pytest.mark.parametrize("entry, field, fragment", [
    ({"value": 3.5, "unit": "GB", "source": "x"}, "eager_call_overhead.unit", "not a time"),
    ({"value": 0, "unit": "us", "source": "x"}, "eager_call_overhead.value", "positive"),
    ({"value": -1, "unit": "us", "source": "x"}, "eager_call_overhead.value", "positive"),
    ({"value": 3.5, "unit": "us"}, "eager_call_overhead.source", "missing"),
    (4, "eager_call_overhead", "mapping"),
])
def test_bad_eager_call_overhead(h200_text, tmp_path, entry, field, fragment):
    path = edit(h200_text, tmp_path, lambda d: d.update(eager_call_overhead=entry))
    expect_error(path, field, fragment)
