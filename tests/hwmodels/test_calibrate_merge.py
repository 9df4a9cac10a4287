"""Merging calibrations: per series and size the median over runs, refitted into a schema-checked file."""
import subprocess
import sys

import pytest
import yaml

from hwmodels import load_device
from hwmodels.calibrate.document import build_document, write_and_check
from hwmodels.calibrate.fit import Series, fit
from hwmodels.calibrate.merge import merge_files, merge_series, series_from_calibration

from .conftest import REPO, assert_one_line_error, run_cli
from .test_calibrate_fit import provenance, synthetic_series


def runs_of(values_per_run):
    """One run per list: a 'read' series at sizes 1, 2 (and 4 where given) with these seconds."""
    runs = []
    for values in values_per_run:
        s = Series("read", "synthetic", "bytes")
        for size, seconds in zip((1, 2, 4), values):
            s.add(size, seconds)
        runs.append({"read": s})
    return runs


def test_merge_series_is_the_median_per_size():
    runs = runs_of([[1.0, 5.0, 9.0], [3.0, 4.0, 7.0], [2.0, 6.0, 8.0]])
    merged = merge_series(runs)
    assert merged["read"].points == [(1.0, 2.0), (2.0, 5.0), (4.0, 8.0)]
    assert merged["read"].what == "synthetic" and merged["read"].size_kind == "bytes"


def test_merge_series_drops_what_some_run_lacks():
    runs = runs_of([[1.0, 5.0, 9.0], [3.0, 4.0], [2.0, 6.0, 8.0]])   # size 4 missing from run 2
    runs[0]["copy"] = Series("copy", "only here", "bytes", [(1.0, 1.0)])
    merged = merge_series(runs)
    assert set(merged) == {"read"} and merged["read"].points == [(1.0, 2.0), (2.0, 5.0)]
    with pytest.raises(ValueError, match="nothing to merge"):
        merge_series([])


def write_run(path, scale, date, load, own=0.0):
    """A calibrated file whose series are the synthetic ones times `scale`."""
    series = {name: Series(s.name, s.what, s.size_kind, [(x, t * scale) for x, t in s.points])
              for name, s in synthetic_series().items()}
    doc = build_document("test-cpu", "synthetic device", 16e9, "test meminfo", fit(series, "fp32"), series,
                         provenance(date=date, load_before=[load, 0.1, 0.1], own_load=own), "fp32")
    write_and_check(path, doc)
    return series


@pytest.fixture
def three_runs(tmp_path):
    paths = [tmp_path / f"run{i}.yaml" for i in range(3)]
    for path, scale, date, load in zip(paths, (1.0, 1.2, 0.9), ("2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z",
                                                                 "2026-01-01T00:02:00Z"), (0.1, 0.3, 0.2)):
        write_run(path, scale, date, load)
    return paths


def test_series_round_trip_through_the_file(three_runs):
    calibration = yaml.safe_load(three_runs[0].read_text())["calibration"]
    rebuilt = series_from_calibration(calibration)
    original = synthetic_series()
    assert set(rebuilt) == set(original)
    for name, s in original.items():
        assert rebuilt[name].size_kind == s.size_kind and rebuilt[name].sizes().tolist() == s.sizes().tolist()
        assert rebuilt[name].seconds() == pytest.approx(s.seconds(), rel=1e-4)   # written with 5 digits


def test_merge_cli_writes_a_loadable_file_with_provenance(three_runs, tmp_path):
    out = tmp_path / "merged.yaml"
    proc = run_cli("hwmodels.calibrate", "--merge", *map(str, three_runs), "--out", str(out), "--name", "merged-cpu")
    assert proc.returncode == 0, proc.stderr
    assert "median over 3 calibration runs" in proc.stdout
    device = load_device(out)
    assert device.name == "merged-cpu"
    cal = device.calibration
    # the median run is the unscaled one: its numbers come back (to the files' 5 written digits)
    single = load_device(three_runs[0])
    assert device.memory_bw == pytest.approx(single.memory_bw, rel=1e-3)
    assert device.launch_overhead_s == pytest.approx(single.launch_overhead_s, rel=1e-3)
    assert [run["date"] for run in cal["merged_from"]] == ["2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z",
                                                           "2026-01-01T00:02:00Z"]
    assert [run["load_average"]["before"][0] for run in cal["merged_from"]] == [0.1, 0.3, 0.2]
    assert cal["load_average"]["before"][0] == 0.3        # the busiest start among the runs
    assert cal["statistic"].startswith("median over 3 calibration runs")
    assert cal["wall_time_s"] == pytest.approx(4.5)
    assert all("median over 3 calibration runs" in source for source in device.sources.values())
    assert "test meminfo" in device.sources["memory_capacity"]


def test_merge_judges_contention_without_the_runs_own_threads(tmp_path):
    """Runs made inside traces.timing record their own busy thread: the merge's busiest start is the one
    with the most load from others, and its warning follows the same rule as a single run's."""
    paths = [tmp_path / f"r{i}.yaml" for i in range(3)]
    for path, load, own in zip(paths, (1.4, 1.0, 0.7), (1.0, 1.0, 0.0)):
        write_run(path, 1.0, "2026-01-01T00:00:00Z", load, own)
    out = tmp_path / "merged.yaml"
    merge_files(paths, out, "m")
    doc = yaml.safe_load(out.read_text())
    assert doc["calibration"]["load_average"]["before"][0] == 0.7       # others 0.7 > 0.4 > 0.0
    assert "own_threads" not in doc["calibration"]["load_average"]
    assert "CPU contention (load average 0.7 at start)" in doc["notes"]
    merge_files(paths[:2], out, "m")
    doc = yaml.safe_load(out.read_text())
    assert doc["calibration"]["load_average"]["own_threads"] == 1.0 and "contention" not in doc["notes"]


def test_merge_errors_are_one_line(three_runs, tmp_path):
    out = str(tmp_path / "m.yaml")
    datasheet = str(REPO / "hwmodels" / "devices" / "l4.yaml")
    assert_one_line_error(run_cli("hwmodels.calibrate", "--merge", str(three_runs[0]), datasheet, "--out", out),
                          "not a calibrated file")
    assert_one_line_error(run_cli("hwmodels.calibrate", "--merge", str(tmp_path / "none.yaml"), "--out", out),
                          "none.yaml")
    assert_one_line_error(run_cli("hwmodels.calibrate", "--merge", str(three_runs[0])), "--merge needs --out")
    assert_one_line_error(run_cli("hwmodels.calibrate", "--device", "cpu", "--merge", str(three_runs[0]),
                                  "--out", out), "either --device")
    other = tmp_path / "threads.yaml"
    other.write_text(three_runs[1].read_text().replace("torch_threads: 2", "torch_threads: 4"))
    assert_one_line_error(run_cli("hwmodels.calibrate", "--merge", str(three_runs[0]), str(other), "--out", out),
                          "different thread counts")


def test_merge_does_not_import_torch(three_runs, tmp_path):
    code = ("import sys\nfrom hwmodels.calibrate.cli import main\n"
            f"main(['--merge', {str(three_runs[0])!r}, '--out', {str(tmp_path / 'm.yaml')!r}])\n"
            "assert 'torch' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, capture_output=True)


def test_merge_medians_the_eager_call_series(tmp_path):
    paths = []
    for i, per_call in enumerate((3.0e-6, 5.0e-6, 4.0e-6)):
        series = synthetic_series()
        series["eager_call"] = Series("eager_call", "decoder layers", "calls", [(55.0, 55 * per_call)])
        doc = build_document("test-cpu", "synthetic device", 16e9, "test meminfo", fit(series, "fp32"), series,
                             provenance(date=f"2026-01-01T00:0{i}:00Z"), "fp32")
        paths.append(tmp_path / f"run{i}.yaml")
        assert write_and_check(paths[-1], doc).tables.eager_call_overhead_s == pytest.approx(per_call)
    runs = [series_from_calibration(yaml.safe_load(p.read_text())["calibration"]) for p in paths]
    assert runs[0]["eager_call"].size_kind == "calls" and runs[0]["eager_call"].points[0][0] == 55.0
    merged = merge_files(paths, tmp_path / "merged.yaml")
    assert merged.tables.eager_call_overhead_s == pytest.approx(4.0e-6, rel=1e-3)   # the median run's value
    assert "median over 3 calibration runs" in merged.sources["eager_call_overhead"]


def test_partial_merge_keeps_a_newer_plans_series_and_says_so(three_runs, tmp_path):
    runs = runs_of([[1.0, 5.0, 9.0], [3.0, 4.0, 7.0], [2.0, 6.0, 8.0]])
    runs[1]["sdpa_core_fp32_d64"] = Series("sdpa_core_fp32_d64", "newer plan", "keys", [(16.0, 1.0), (32.0, 2.0)])
    runs[2]["sdpa_core_fp32_d64"] = Series("sdpa_core_fp32_d64", "newer plan", "keys", [(16.0, 3.0), (32.0, 4.0)])
    assert set(merge_series(runs)) == {"read"}                         # the default keeps the common series
    merged = merge_series(runs, partial=True)
    assert merged["sdpa_core_fp32_d64"].points == [(16.0, 2.0), (32.0, 3.0)]   # median over the two that have it
    assert merged["read"].points == merge_series(runs)["read"].points
    # through the files: a run with an extra series, merged with --partial-series, names it in the notes
    doc = yaml.safe_load(three_runs[0].read_text())
    doc["calibration"]["series"]["sdpa_core_fp32_d64"] = {"what": "newer plan", "size": "keys",
                                                          "points_size_seconds": [[16, 1e-6], [32, 2e-6]]}
    extra = tmp_path / "extra.yaml"
    extra.write_text(yaml.safe_dump(doc, sort_keys=False))
    out = tmp_path / "partial.yaml"
    merge_files([*three_runs[1:], extra], out, "partial-cpu", partial=True)
    written = yaml.safe_load(out.read_text())
    assert "sdpa_core_fp32_d64" in written["calibration"]["series"]
    assert "sdpa_core_fp32_d64: median over 1 of the 3 runs (extra.yaml)" in written["notes"]
    merge_files([*three_runs[1:], extra], tmp_path / "common.yaml", "common-cpu")
    assert "sdpa_core_fp32_d64" not in yaml.safe_load((tmp_path / "common.yaml").read_text())["calibration"]["series"]
    proc = run_cli("hwmodels.calibrate", "--device", "cpu", "--partial-series")
    assert_one_line_error(proc, "--partial-series only applies to --merge")
