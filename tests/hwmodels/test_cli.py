"""CLI contracts: python -m hwmodels and python -m hwmodels.calibrate, run as subprocesses."""
import importlib.metadata
import importlib.util
import json
from pathlib import Path

import pytest

import hwmodels
from hwmodels import load_device

from .conftest import assert_one_line_error, run_cli

HAS_TORCH = importlib.util.find_spec("torch") is not None


def test_list_prints_names_one_per_line():
    proc = run_cli("hwmodels", "list", "--names")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == hwmodels.list_devices()
    assert "h200-sxm" in proc.stdout.splitlines()


def test_list_shows_memory_bandwidth_and_dense_flops():
    proc = run_cli("hwmodels", "list")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["name", "memory", "bandwidth", "bf16", "dense", "fp8", "dense", "from"]
    assert len(lines) == 1 + len(hwmodels.list_devices())
    h200 = next(line for line in lines if line.startswith("h200-sxm "))
    assert "141 GiB" in h200 and "4.8 TB/s" in h200 and "989.4 TFLOP/s" in h200 and h200.endswith("datasheet")
    a100 = next(line for line in lines if line.startswith("a100-80g-sxm "))
    assert "(bf16)" in a100                                   # no fp8 units: the fallback is named


def test_show_prints_table_with_sources():
    proc = run_cli("hwmodels", "show", "h200-sxm")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "4.8 TB/s" in out and "141 GiB" in out and "989.4 TFLOP/s" in out
    assert "source" in out and "nvidia.com" in out
    assert "fallback: not in the file, uses the int8 rate" in out   # int4


def test_show_json():
    proc = run_cli("hwmodels", "show", "l4", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["memory_bw"] == pytest.approx(300e9) and data["name"] == "l4"


def test_show_accepts_a_path(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text((hwmodels.DEVICES_DIR / "l4.yaml").read_text())
    proc = run_cli("hwmodels", "show", str(path))
    assert proc.returncode == 0 and str(path) in proc.stdout


def test_show_lists_the_optional_tables_point_by_point(tmp_path):
    import yaml
    data = yaml.safe_load((hwmodels.DEVICES_DIR / "l4.yaml").read_text())
    data["fresh_alloc_efficiency"] = {"form": "table", "size_unit": "MiB", "source": "test fresh",
                                      "points": [[16, 1.0], [32, 0.35]]}
    data["attn_scores_efficiency"] = {"form": "table", "size_unit": "head_dim", "source": "test attn",
                                      "points": [[64, 0.7], [128, 0.9]]}
    path = tmp_path / "tables.yaml"
    path.write_text(yaml.safe_dump(data))
    out = run_cli("hwmodels", "show", str(path)).stdout
    assert "fresh_alloc_efficiency" in out and "33.55 MB: 0.35" in out and "test fresh" in out
    assert "64 head_dim: 0.7, 128 head_dim: 0.9" in out
    assert "fresh_alloc_efficiency" not in run_cli("hwmodels", "show", "l4").stdout


def test_show_unknown_name_is_one_line():
    assert_one_line_error(run_cli("hwmodels", "show", "h300"), "h300", "unknown device name")


def test_show_bad_file_is_one_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text((hwmodels.DEVICES_DIR / "l4.yaml").read_text().replace("unit: GB/s", "unit: GB"))
    assert_one_line_error(run_cli("hwmodels", "show", str(path)), "bad.yaml", "memory_bandwidth.unit")


@pytest.mark.parametrize("args", [(), ("frobnicate",), ("show",), ("list", "--bogus")])
def test_usage_mistakes_are_one_line(args):
    assert_one_line_error(run_cli("hwmodels", *args))


@pytest.mark.parametrize("args, fragment", [
    ((), "--device"),
    (("--device", "tpu"), "invalid choice"),
    (("--device", "cpu", "--out", "/no/such/dir/x.yaml"), "does not exist"),
    (("--device", "cpu", "--out", "x.txt"), ".yaml"),
    (("--device", "cpu", "--name", "a b"), "--name"),
])
def test_calibrate_usage_mistakes_are_one_line(args, fragment):
    assert_one_line_error(run_cli("hwmodels.calibrate", *args), fragment)


# Decided without importing torch here (slow): a CPU build of torch or no NVIDIA device node.
NO_CUDA = HAS_TORCH and ("+cpu" in importlib.metadata.version("torch") or not Path("/dev/nvidiactl").exists())


@pytest.mark.skipif(not NO_CUDA, reason="needs torch on a machine without CUDA")
def test_calibrate_cuda_without_cuda_is_one_line():
    assert_one_line_error(run_cli("hwmodels.calibrate", "--device", "cuda"), "torch.cuda is not available")


@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_calibrate_quick_writes_a_loadable_file(tmp_path):
    out = tmp_path / "quick-cpu.yaml"
    proc = run_cli("hwmodels.calibrate", "--device", "cpu", "--quick", "--out", str(out), "--name", "quick-cpu")
    assert proc.returncode == 0, proc.stderr
    device = load_device(out)
    assert device.name == "quick-cpu"
    assert device.memory_bw > 1e8 and device.peak_flops("fp32") > 1e8
    assert 0 < device.launch_overhead_s < 1e-3
    cal = device.calibration
    assert cal["mode"] == "quick" and cal["env"]["OMP_WAIT_POLICY"]
    assert 0 < cal["wall_time_s"] < 60
    assert {"dispatch", "host_step", "read", "copy", "gemv_fp32", "gemm_fp32"} <= set(cal["series"])
    assert "wrote" in proc.stdout and "read bandwidth" in proc.stdout
    assert not out.with_name(out.name + ".tmp").exists()
