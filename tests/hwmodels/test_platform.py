"""hwmodels.platform: interconnect, energy and price data of the shipped devices, and its file checks."""
from pathlib import Path

import pytest

import hwmodels
from hwmodels import HardwareFileError, load_device
from hwmodels import platform as P

WITH_DATA = ["a100-40g-sxm", "a100-80g-sxm", "b200", "gh200", "gh200-144g", "h100-sxm", "h200-sxm", "l4", "l40s",
             "mi300x", "tpu-v5e"]
DEVICES_DIR = Path(hwmodels.DEVICES_DIR)


def test_every_shipped_gpu_and_tpu_has_all_sections():
    assert set(WITH_DATA) <= set(hwmodels.list_devices())
    for name in WITH_DATA:
        assert P.load_interconnect(name) is not None, name
        assert P.load_energy(name) is not None, name
        assert P.default_price(name) is not None, name


def test_platform_files_only_for_shipped_devices():
    stems = {p.stem for p in P.PLATFORM_DIR.glob("*.yaml")}
    assert stems == set(WITH_DATA)


@pytest.mark.parametrize("name", WITH_DATA)
def test_every_number_has_a_source(name):
    link, energy, price = P.load_interconnect(name), P.load_energy(name), P.default_price(name)
    for key in ("max_devices", "per_direction_bandwidth", "achievable_fraction", "latency"):
        assert link.sources[key].strip(), key
    for key in ("dram_energy", "static_power", "tdp"):
        assert energy.sources[key].strip(), key
    assert all(energy.sources[f"flop_energy.{d}"] for d in energy.flop_j)
    assert price.source.strip() and price.date.strip()


def test_cpu_local_is_neutral():
    assert P.load_interconnect("cpu-local") is None
    assert P.load_energy("cpu-local") is None
    assert P.default_price("cpu-local") is None


@pytest.mark.parametrize("name, kind, aggregate_gb_s", [
    ("h100-sxm", "nvlink4", 900), ("h200-sxm", "nvlink4", 900), ("a100-80g-sxm", "nvlink3", 600),
    ("l4", "pcie4", 64), ("l40s", "pcie4", 64), ("mi300x", "infinity-fabric", 896), ("tpu-v5e", "ici", 200)])
def test_datasheet_link_figures(name, kind, aggregate_gb_s):
    link = P.load_interconnect(name)
    assert link.kind == kind
    assert link.aggregate_bw == pytest.approx(aggregate_gb_s * 1e9)
    assert link.per_direction_bw == pytest.approx(link.aggregate_bw / 2)
    assert 0 < link.achievable_fraction <= 1 and 0 < link.latency_s < 1e-5
    assert link.effective_bw == pytest.approx(link.per_direction_bw * link.achievable_fraction)


@pytest.mark.parametrize("name", WITH_DATA)
def test_terms_are_fitted_or_transferred_within_their_bounds(name):
    """Every shipped energy term comes from python -m sim.fit_energy (fitted or transferred, with its rule),
    static power is below the board limit, and the byte energy is a physical pJ/bit figure."""
    energy = P.load_energy(name)
    for key in ("dram_energy", "static_power", "flop_energy.bf16"):
        assert energy.sources[key].split(":")[0] in ("fitted", "transferred"), (name, key)
        assert "sim.fit_energy" in energy.sources[key]
    assert 0 < energy.static_w < energy.tdp_w
    assert 3e-12 <= energy.j_per_byte / 8 <= 32e-12
    assert energy.onchip_j_per_byte == 0 and energy.file.endswith(f"{name}.yaml")


def test_measured_devices_are_fitted_and_their_kin_transferred():
    assert P.load_energy("h100-sxm").sources["static_power"].startswith("fitted")
    assert P.load_energy("b200").sources["static_power"].startswith("fitted")
    h100 = P.load_energy("h100-sxm")
    for same_die in ("h200-sxm", "gh200", "gh200-144g"):     # the same GH100 die: the same terms
        e = P.load_energy(same_die)
        assert (e.static_w, e.j_per_byte, e.flop_j["bf16"]) == (h100.static_w, h100.j_per_byte, h100.flop_j["bf16"])
        assert "same GPU die" in e.sources["static_power"]
    # other dies: the same share of their own TDP
    a100 = P.load_energy("a100-80g-sxm")
    assert a100.static_w / a100.tdp_w == pytest.approx(h100.static_w / h100.tdp_w, rel=1e-2)


def test_flop_energy_of_an_unlisted_dtype_follows_its_peak():
    energy, device = P.load_energy("h100-sxm"), load_device("h100-sxm")
    assert energy.flop_energy("fp8", device) == pytest.approx(energy.flop_j["bf16"] / 2)
    assert energy.flop_energy("fp8") == energy.flop_j["bf16"]     # no device: the nearest wider dtype
    assert energy.flop_energy("fp32", device) > energy.flop_j["bf16"]


def test_hbm_is_cheaper_per_bit_than_gddr():
    assert P.load_energy("h100-sxm").dram_j_per_byte < P.load_energy("l4").dram_j_per_byte


def _user_device(tmp_path, text):
    device_file = tmp_path / "mygpu.yaml"
    device_file.write_text((DEVICES_DIR / "h100-sxm.yaml").read_text())
    (tmp_path / "mygpu.platform.yaml").write_text(text)
    return load_device(device_file)


def test_platform_file_next_to_a_user_device_file_takes_precedence(tmp_path):
    device = _user_device(tmp_path, "schema_version: 1\ndevice: h100-sxm\n"
                          "price:\n  hourly: {value: 1.25, unit: USD/h, date: '2026-12', source: my contract}\n")
    assert P.default_price(device).usd_per_hour == 1.25
    assert P.load_interconnect(device).kind == "nvlink4"           # other sections: the shipped file


@pytest.mark.parametrize("section, fragment", [
    ("price:\n  hourly: {value: 1, unit: EUR/h, date: x, source: s}\n", "price.hourly.unit"),
    ("price:\n  hourly: {value: 1, unit: USD/h, source: s}\n", "price.hourly.date"),
    ("energy:\n  dram_energy: {value: 3, unit: pJ/bit}\n  onchip_energy: {value: 1, unit: pJ/bit, source: s}\n"
     "  flop_energy: {bf16: {value: 1, unit: pJ/FLOP, source: s}}\n  static_power: {value: 1, unit: W, source: s}\n",
     "energy.dram_energy.source"),
    ("energy:\n  dram_energy: {value: 3, unit: pJ/bit, source: s}\n  onchip_energy: {value: 1, unit: pJ/bit, source: s}\n"
     "  flop_energy: {bf17: {value: 1, unit: pJ/FLOP, source: s}}\n  static_power: {value: 1, unit: W, source: s}\n",
     "energy.flop_energy.bf17"),
    ("interconnect:\n  kind: x\n  topology: star\n  max_devices: {value: 8, source: s}\n"
     "  per_direction_bandwidth: {value: 1, unit: GB/s, source: s}\n  achievable_fraction: {value: 0.5, source: s}\n"
     "  latency: {value: 1, unit: us, source: s}\n", "interconnect.topology"),
    ("interconnect:\n  kind: x\n  topology: switch\n", "interconnect.max_devices"),
    ("bogus: 1\n", "bogus"),
])
def test_bad_platform_files_name_the_field(tmp_path, section, fragment):
    device = _user_device(tmp_path, "schema_version: 1\ndevice: h100-sxm\n" + section)
    with pytest.raises(HardwareFileError, match=fragment.replace(".", r"\.")):
        P.load_energy(device), P.default_price(device), P.load_interconnect(device)


def test_platform_file_for_another_device_is_refused(tmp_path):
    device = _user_device(tmp_path, "schema_version: 1\ndevice: l4\n")
    with pytest.raises(HardwareFileError, match="device"):
        P.load_energy(device)


def test_onchip_energy_is_optional_and_adds_to_the_byte_energy(tmp_path):
    device = _user_device(tmp_path, "schema_version: 1\ndevice: h100-sxm\nenergy:\n"
                          "  dram_energy: {value: 4, unit: pJ/bit, source: s}\n  onchip_energy: {value: 2, unit: pJ/bit, source: s}\n"
                          "  flop_energy: {bf16: {value: 1, unit: pJ/FLOP, source: s}}\n  static_power: {value: 50, unit: W, source: s}\n")
    energy = P.load_energy(device)
    assert energy.j_per_byte == pytest.approx(6e-12 * 8) and energy.tdp_w is None
    assert energy.file == str(tmp_path / "mygpu.platform.yaml")
