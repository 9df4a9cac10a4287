"""Issue 27 item 2: energy and cost follow the user's own device file, as the user types the command.

A device YAML with a name kvsim does not ship can use --energy and --price-per-hour; one whose name resembles
a SKU ("h100-custom") never borrows the shipped H100's price or energy; its own `<stem>.platform.yaml` wins."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

import hwmodels

ROOT = Path(__file__).resolve().parents[2]
H100 = (Path(hwmodels.DEVICES_DIR) / "h100-sxm.yaml").read_text()
POINT = ["--model", "llama-3-8b", "--prompt", "512", "--gen", "64", "--batch", "16"]


def _device(folder: Path, name: str, platform: str | None = None) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(H100.replace("name: h100-sxm", f"name: {name}"))
    if platform is not None:
        (folder / f"{name}.platform.yaml").write_text(f"schema_version: 1\ndevice: {name}\n" + platform)
    return path


def _predict(*argv) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sim.predict", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_a_non_shipped_name_gets_cost_from_an_explicit_price(tmp_path):
    hw = _device(tmp_path, "mygpu")
    proc = _predict("--hw", str(hw), *POINT, "--price-per-hour", "2", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["hw"] == "mygpu" and out["price_usd_per_hour"] == 2 and out["price_source"] == "command line"
    assert out["cost_per_mtok"] == pytest.approx(2 / 3600 * 1e6 / out["tokens_per_s"])
    # no energy figures of its own: said, not borrowed from the H100 it copies
    assert out["energy_j_per_token"] is None and "mygpu.platform.yaml" in out["energy_note"]
    text = _predict("--hw", str(hw), *POINT, "--energy")
    assert text.returncode == 0 and "no energy data for mygpu" in text.stdout and "no price data for mygpu" in text.stdout


def test_a_sku_like_name_uses_its_own_platform_file_and_never_the_shipped_skus(tmp_path):
    hw = _device(tmp_path, "h100-custom", "price:\n  hourly: {value: 1.25, unit: USD/h, date: '2026-12', source: my contract}\n"
                 "energy:\n  dram_energy: {value: 8, unit: pJ/bit, source: mine}\n"
                 "  flop_energy: {bf16: {value: 1, unit: pJ/FLOP, source: mine}}\n"
                 "  static_power: {value: 200, unit: W, source: mine}\n  tdp: {value: 650, unit: W, source: mine}\n")
    proc = _predict("--hw", str(hw), *POINT, "--energy", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["price_usd_per_hour"] == 1.25 and "h100-custom.platform.yaml" in out["price_source"]
    assert out["energy_source"].endswith("h100-custom.platform.yaml")
    static = out["decode_energy_breakdown_j_per_token"]["static"]
    assert static == pytest.approx(200 * out["tpot_s"] / 16, rel=1e-6)          # its own 200 W, not the H100's
    assert out["decode_power_w_per_device"] <= 650
    # without a platform file of its own: nothing borrowed from h100-sxm
    bare = _device(tmp_path / "bare", "h100-custom") if (tmp_path / "bare").mkdir() is None else None
    out = json.loads(_predict("--hw", str(bare), *POINT, "--energy", "--json").stdout)
    assert out["energy_j_per_token"] is None and out["price_usd_per_hour"] is None
    assert "no price data for h100-custom" in out["price_source"]


def test_energy_and_cost_at_the_max_batch_are_reported(tmp_path):
    out = json.loads(_predict("--hw", "h100-sxm", *POINT, "--energy", "--json").stdout)
    assert out["max_batch"] > 16 and out["cost_per_mtok_at_max_batch"] < out["cost_per_mtok"]
    assert out["energy_j_per_token_at_max_batch"] < out["energy_j_per_token"]      # weights shared by more tokens
    assert 0 < out["decode_power_w_per_device_at_max_batch"] <= 700
    text = _predict("--hw", "h100-sxm", *POINT, "--energy").stdout
    assert "at the max batch" in text and "terms from hwmodels/platform/h100-sxm.yaml" in text
