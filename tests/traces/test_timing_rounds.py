"""traces.timing --rounds / --calibrate: round-robin measurement, statistics over every round's samples,
resume by rounds, and one calibration per round merged into the hardware file."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("torch")
pytest.importorskip("keyformer.generate")

from hwmodels import load_device  # noqa: E402
from tests.helpers import assert_one_line_error  # noqa: E402
from tests.hwmodels.test_calibrate_fit import synthetic_series  # noqa: E402
from traces import timing  # noqa: E402
import traces.timing.measure  # noqa: E402,F401  (timing.measure: the functions the rounds call)

GRID = ["--model", "tiny-gpt2", "--batch", "1,2", "--context", "32", "--policy", "full", "--prefill", "16",
        "--repeats", "3", "--warmup", "0"]
POINTS = 3   # 2 decode + 1 prefill


def run(argv, capsys):
    rc = timing.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def table_of(out: Path) -> pd.DataFrame:
    return pd.read_parquet(out / "tiny-gpt2" / "timing.parquet")


def samples(row) -> list[float]:
    return [float(v) for v in row["samples_s"].split()]


@pytest.fixture
def counted(monkeypatch):
    """Count the timed point-rounds (decode and prefill) while still measuring for real."""
    calls = []
    decode, prefill = timing.measure.time_decode, timing.measure.time_prefill
    monkeypatch.setattr(timing.measure, "time_decode", lambda *a, **k: calls.append("decode") or decode(*a, **k))
    monkeypatch.setattr(timing.measure, "time_prefill", lambda *a, **k: calls.append("prefill") or prefill(*a, **k))
    return calls


def test_one_round_keeps_todays_columns(tmp_path, capsys):
    rc, _, err = run(GRID + ["--out", tmp_path], capsys)
    assert rc == 0, err
    table = table_of(tmp_path)
    assert list(table.columns) == list(timing.TIMING_COLUMNS)
    old = ("kv_tokens", "slots", "median_s", "p10_s", "p90_s", "mean_s", "min_s", "cpu_median_s", "peak_mem_bytes",
           "repeats", "warmup", "threads", "omp_wait_policy", "dtype", "load_1min", "measured_at")
    assert timing.TIMING_COLUMNS[:len(timing.KEY_COLUMNS) + len(old)] == timing.KEY_COLUMNS + old
    assert (table["rounds"] == 1).all()
    for _, row in table.iterrows():
        assert len(samples(row)) == 3 and row["median_s"] == np.median(samples(row))
        assert row["round_medians_s"] == f"{row['median_s']:.6g}"
    assert json.loads((tmp_path / "tiny-gpt2" / "manifest.json").read_text())["rounds"] == 1


def test_two_rounds_pool_the_samples(tmp_path, capsys, counted):
    rc, _, err = run(GRID + ["--rounds", 2, "--out", tmp_path], capsys)
    assert rc == 0, err
    assert len(counted) == 2 * POINTS
    table = table_of(tmp_path)
    assert len(table) == POINTS and (table["rounds"] == 2).all()
    for _, row in table.iterrows():
        wall, cpu = samples(row), [float(v) for v in row["cpu_samples_s"].split()]
        assert len(wall) == len(cpu) == 2 * 3
        assert row["median_s"] == np.median(wall) and row["min_s"] == min(wall)
        assert row["p90_s"] == pytest.approx(np.percentile(wall, 90)) and row["cpu_median_s"] == np.median(cpu)
        per_round = [f"{np.median(wall[:3]):.6g}", f"{np.median(wall[3:]):.6g}"]
        assert row["round_medians_s"].split() == per_round
    # the csv stays writable and readable
    assert len(pd.read_csv(tmp_path / "tiny-gpt2" / "timing.csv")) == POINTS


def test_more_rounds_resume_and_fewer_are_refused(tmp_path, capsys, counted):
    assert run(GRID + ["--out", tmp_path], capsys)[0] == 0
    first = table_of(tmp_path).set_index(["phase", "batch"])
    counted.clear()
    rc, _, err = run(GRID + ["--rounds", 2, "--out", tmp_path], capsys)
    assert rc == 0, err
    assert len(counted) == POINTS          # only round 2 was measured
    second = table_of(tmp_path).set_index(["phase", "batch"])
    assert (second["rounds"] == 2).all()
    for key, row in second.iterrows():
        assert samples(row)[:3] == samples(first.loc[key])   # round 1's samples are kept as they were
    counted.clear()
    assert run(GRID + ["--rounds", 2, "--out", tmp_path], capsys)[0] == 0
    assert counted == []                   # nothing missing
    rc, _, err = run(GRID + ["--out", tmp_path], capsys)
    assert_one_line_error(rc, err, "--rounds 2")


def test_interrupted_round_resumes_where_it_stopped(tmp_path, capsys, monkeypatch):
    calls = []
    decode = timing.measure.time_decode

    def interrupt_last_point(*a, **k):
        calls.append(1)
        if len(calls) == 4:   # decode calls: 2 in round 1, then round 2's second one is stopped by Ctrl-C
            raise KeyboardInterrupt
        return decode(*a, **k)

    monkeypatch.setattr(timing.measure, "time_decode", interrupt_last_point)
    rc, _, _ = run(GRID + ["--rounds", 2, "--out", tmp_path], capsys)
    assert rc == 130
    assert sorted(table_of(tmp_path)["rounds"]) == [1, 2, 2]   # prefill and batch 1 got round 2, batch 2 not
    monkeypatch.setattr(timing.measure, "time_decode", lambda *a, **k: calls.append(2) or decode(*a, **k))
    assert run(GRID + ["--rounds", 2, "--out", tmp_path], capsys)[0] == 0
    assert calls.count(2) == 1 and (table_of(tmp_path)["rounds"] == 2).all()


def test_legacy_rows_cannot_get_more_rounds(tmp_path, capsys):
    assert run(GRID + ["--out", tmp_path], capsys)[0] == 0
    path = tmp_path / "tiny-gpt2" / "timing.parquet"
    table_of(tmp_path).drop(columns=["rounds", "round_medians_s", "samples_s", "cpu_samples_s"]).to_parquet(path)
    assert run(GRID + ["--out", tmp_path], capsys)[0] == 0      # one round: the old rows count as done
    rc, _, err = run(GRID + ["--rounds", 2, "--out", tmp_path], capsys)
    assert_one_line_error(rc, err, "before samples were stored")


@pytest.fixture
def scripted_calibration(monkeypatch):
    """The calibration microbenchmarks replaced by synthetic series, 1.0x, 2.0x, 1.5x ... per call."""
    import hwmodels.calibrate.bench as bench

    scales = iter([1.0, 2.0, 1.5, 1.0, 1.0])
    calls = []

    def run_all(plan, progress=None, timer=None):
        scale = next(scales)
        calls.append(scale)
        return {name: type(s)(s.name, s.what, s.size_kind, [(x, t * scale) for x, t in s.points])
                for name, s in synthetic_series().items()}

    monkeypatch.setattr(bench, "run_all", run_all)
    return calls


def test_calibrate_every_round_and_merge(tmp_path, capsys, scripted_calibration):
    hw = tmp_path / "hw" / "cpu-test-1t.yaml"
    hw.parent.mkdir()
    out = tmp_path / "grid"
    rc, said, err = run(GRID + ["--rounds", 2, "--calibrate", hw, "--quick-calibration", "--out", out], capsys)
    assert rc == 0, err
    assert scripted_calibration == [1.0, 2.0]
    assert "2 run(s) now, 0 kept" in said and "median over 2 calibration runs" in said
    rounds = [load_device(out / "calibration-rounds" / f"round-{r}-tiny-gpt2.yaml") for r in (1, 2)]
    merged = load_device(hw)
    assert merged.name == "cpu-test-1t" and len(merged.calibration["merged_from"]) == 2
    # the median of two runs is their mean: dispatch 1x and 2x -> 1.5x
    assert merged.launch_overhead_s == pytest.approx(1.5 * rounds[0].launch_overhead_s, rel=1e-3)
    manifest = json.loads((out / "tiny-gpt2" / "manifest.json").read_text())
    assert manifest["hw_device"] == "../../hw/cpu-test-1t.yaml"
    # a third round: rounds 1-2 keep their files, only round 3 is calibrated, the merge covers all three
    rc, said, err = run(GRID + ["--rounds", 3, "--calibrate", hw, "--quick-calibration", "--out", out], capsys)
    assert rc == 0, err
    assert scripted_calibration == [1.0, 2.0, 1.5] and "1 run(s) now, 2 kept" in said
    merged = load_device(hw)
    assert len(merged.calibration["merged_from"]) == 3
    assert merged.launch_overhead_s == pytest.approx(1.5 * rounds[0].launch_overhead_s, rel=1e-3)
    # --fresh drops the old round calibrations with the old points
    rc, _, err = run(GRID + ["--calibrate", hw, "--quick-calibration", "--fresh", "--out", out], capsys)
    assert rc == 0, err
    assert sorted(p.name for p in (out / "calibration-rounds").iterdir()) == ["round-1-tiny-gpt2.yaml"]


@pytest.mark.parametrize("argv, message", [
    (["--rounds", "0"], "--rounds must be >= 1"),
    (["--quick-calibration"], "needs --calibrate"),
    (["--calibrate", "x.txt"], "must end in .yaml"),
    (["--calibrate", "no/such/dir/x.yaml"], "does not exist"),
    (["--calibrate", "x.yaml", "--hw", "cpu-local"], "drop --hw"),
])
def test_round_errors_are_one_line(tmp_path, capsys, argv, message):
    rc, _, err = run(["--model", "tiny-gpt2", "--out", tmp_path] + argv, capsys)
    assert_one_line_error(rc, err, message)
