"""traces.timing_format: the one torch-free module that writes and reads timing folders."""
from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from traces import timing_format as tf

POINT = {"phase": "decode", "policy": "full", "cache_ratio": 1.0, "batch": 1, "context": 32}


def _row(**extra):
    return POINT | {"kv_tokens": 33.0, "slots": 34, "median_s": 0.01, "p10_s": 0.01, "p90_s": 0.01, "mean_s": 0.01,
                    "min_s": 0.01, "cpu_median_s": 0.01, "peak_mem_bytes": -1, "repeats": 2, "warmup": 0,
                    "threads": 1, "omp_wait_policy": "ACTIVE", "dtype": "fp32", "load_1min": 0.0,
                    "measured_at": "now", "rounds": 1, "round_medians_s": "0.01",
                    "samples_s": tf.encode_samples([0.01, 0.01]), "cpu_samples_s": tf.encode_samples([0.01, 0.01])} | extra


def write_folder(path, hw="cpu-local", settings=None):
    folder = tf.TimingFolder(path)
    folder.add(_row())
    folder.write({"schema_version": tf.SCHEMA_VERSION, "kind": tf.KIND, "hw_device": hw,
                  "grid_settings": settings or {"repeats": 2}}, {"model_type": "gpt2"})
    return folder


def test_written_folder_reads_back(tmp_path):
    write_folder(tmp_path / "m")
    files = sorted(p.name for p in (tmp_path / "m").iterdir())
    assert files == ["config.json", "manifest.json", "timing.csv", "timing.parquet"]   # no temp files left
    source = tf.load_timing(tmp_path / "m", data_root=tmp_path)
    assert source.name == "m" and source.hw == "cpu-local" and source.profile == "kvsim-eager" and source.beams == 1
    assert list(source.table.columns) == list(tf.TIMING_COLUMNS) and source.manifest["points"] == 1
    assert tf.find_timing_folders([tmp_path]) == [tmp_path / "m"]
    assert tf.find_timing_folders(data_root=tmp_path) == [tmp_path / "m"]


def test_resume_keeps_rows_and_refuses_other_settings(tmp_path):
    write_folder(tmp_path / "m")
    folder = tf.TimingFolder.open(tmp_path / "m", {"repeats": 2}, fresh=False)
    assert folder.done() == {tf.point_key(POINT)} and folder.row(POINT)["median_s"] == 0.01
    with pytest.raises(tf.TimingError, match="other settings .*repeats 2 -> 3"):
        tf.TimingFolder.open(tmp_path / "m", {"repeats": 3}, fresh=False)
    assert tf.TimingFolder.open(tmp_path / "m", {"repeats": 3}, fresh=True).rows == []


def test_samples_round_trip_exactly_and_rounds_default_to_one():
    values = [0.1, 1 / 3, 2e-7]
    assert tf.decode_samples(tf.encode_samples(values)) == values and tf.decode_samples(None) == []
    assert tf.rounds_of({}) == 1 and tf.rounds_of({"rounds": float("nan")}) == 1 and tf.rounds_of({"rounds": 3}) == 3


@pytest.mark.parametrize("breakage, message", [
    ("kind", "not a timing manifest of kind"), ("hw", "no hw_device"), ("config", "config.json missing"),
    ("table", "unreadable"), ("column", "missing column(s) median_s")])
def test_reader_errors_name_the_file(tmp_path, breakage, message):
    folder = write_folder(tmp_path / "m").path
    manifest = json.loads((folder / "manifest.json").read_text())
    if breakage == "kind":
        (folder / "manifest.json").write_text(json.dumps(manifest | {"kind": "kvsim-trace"}))
    elif breakage == "hw":
        (folder / "manifest.json").write_text(json.dumps({k: v for k, v in manifest.items() if k != "hw_device"}))
    elif breakage == "config":
        (folder / "config.json").unlink()
    elif breakage == "table":
        (folder / "timing.parquet").write_bytes(b"no")
    else:
        pd.read_parquet(folder / "timing.parquet").drop(columns="median_s").to_parquet(folder / "timing.parquet")
    with pytest.raises(ValueError) as exc:
        tf.load_timing(folder)
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_explicit_root_without_timing_folders_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="no timing folder"):
        tf.find_timing_folders([tmp_path])
    with pytest.raises(FileNotFoundError):
        tf.find_timing_folders([tmp_path / "missing"])


def test_bundled_timing_folders_load_and_sim_reads_through_this_module():
    from sim.validation import measured
    found = measured.find_timing_folders()
    assert found and all(tf.load_timing(p).name.count("/") == 1 for p in found)
    assert measured.load_timing is not tf.load_timing and measured.TimingSource is tf.TimingSource


def test_format_and_timing_import_no_simulator_and_the_format_no_torch():
    code = ("import sys, traces.timing_format, traces.catalog\n"
            "assert not [n for n in sys.modules if n.split('.')[0] in ('torch', 'sim')]\n"
            "import traces.timing, workflows.gpu.ingest\n"
            "assert not [n for n in sys.modules if n.split('.')[0] == 'sim'], 'traces.timing imports sim'\n")
    subprocess.run([sys.executable, "-c", code], check=True)
