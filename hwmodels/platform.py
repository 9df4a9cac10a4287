"""What one device needs beyond itself: its interconnect (for tensor and pipeline parallelism), its energy
figures (joules per token) and an hourly price (cost per token), every number with a source.

The shipped data lives in `hwmodels/platform/<device>.yaml`, one file per device, apart from the device
file so that the device file (whose content hash keys result caches and golden outputs) stays
byte-identical. A device file given by path may have its own platform file next to it,
`<stem>.platform.yaml`, which takes precedence per section (a user's own figures or prices). A device
with neither (cpu-local) gives None: callers say "no interconnect/energy/price data" instead of guessing.

    schema_version: 1
    device: h100-sxm
    interconnect:
      kind: nvlink4                 # free word: nvlink3, nvlink4, pcie4, infinity-fabric, ici, ...
      description: ...
      topology: switch              # switch | mesh | torus | pcie | ring
      max_devices: {value: 8, source: ...}           # devices one collective domain holds
      aggregate_bandwidth: {value: 900, unit: GB/s, source: ...}   # both directions, all links
      per_direction_bandwidth: {value: 450, unit: GB/s, source: ...}   # what one device sends at once
      achievable_fraction: {value: 0.8, source: ...}   # of per_direction_bandwidth, large messages
      latency: {value: 1, unit: us, source: ...}       # per step of a collective (one hop)
    energy:                         # the power model of sim.energy: P = static + bytes/s x e_byte + FLOP/s x e_flop
      memory_kind: HBM3
      dram_energy: {value: 6.4, unit: pJ/bit, source: ...}    # per bit read or written in device memory, with its
                                                              # trip through L2 to the cores (python -m sim.fit_energy)
      onchip_energy: {value: 0, unit: pJ/bit, source: ...}    # optional: on-chip movement counted apart (default 0)
      flop_energy: {bf16: {value: 1.4, unit: pJ/FLOP, source: ...}}  # a dtype not listed: same power at its peak
      static_power: {value: 330, unit: W, source: ...}        # drawn while serving, whatever the step does
      tdp: {value: 700, unit: W, source: ...}                 # board power limit: modelled power is capped there
    price:
      hourly: {value: 2.99, unit: USD/h, date: "2024-2025", source: ...}   # per device-hour

Never imports another project package (hwmodels is the bottom layer).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

from .device import FALLBACK, Device
from .dtypes import DTYPES, canonical_dtype
from .errors import HardwareFileError
from .registry import load_device
from .schema import load_yaml
from .units import UnitError, to_base

PLATFORM_DIR = Path(__file__).resolve().parent / "platform"
SCHEMA_VERSION = 1
SECTIONS = ("interconnect", "energy", "price")
TOPOLOGIES = ("switch", "mesh", "torus", "pcie", "ring")
# energy and power units (hwmodels.units has none: these quantities exist only here)
ENERGY_PER_BIT = {"pJ/bit": 1e-12, "fJ/bit": 1e-15, "nJ/bit": 1e-9}
ENERGY_PER_BYTE = {"pJ/B": 1e-12, "nJ/B": 1e-9}
ENERGY_PER_OP = {"pJ/FLOP": 1e-12, "fJ/FLOP": 1e-15, "pJ/OP": 1e-12, "fJ/OP": 1e-15}
POWER = {"W": 1.0, "kW": 1e3}
PRICE = {"USD/h": 1.0}


@dataclass(frozen=True)
class Interconnect:
    """The links between devices of one kind, in base units (bytes/s, s)."""
    kind: str
    description: str
    topology: str
    max_devices: int
    aggregate_bw: float            # bytes/s, both directions, all links of one device
    per_direction_bw: float        # bytes/s one device can send at once (what a ring collective uses)
    achievable_fraction: float     # of per_direction_bw for large messages
    latency_s: float               # per step (hop) of a collective
    sources: Mapping[str, str] = field(default_factory=dict)

    @property
    def effective_bw(self) -> float:
        """Bytes/s a large collective message moves per device and direction."""
        return self.per_direction_bw * self.achievable_fraction


@dataclass(frozen=True)
class Energy:
    """Energy figures in base units (J per byte, J per FLOP, W)."""
    memory_kind: str
    dram_j_per_byte: float
    onchip_j_per_byte: float
    flop_j: Mapping[str, float]    # dtypes the file lists
    static_w: float
    tdp_w: float | None
    sources: Mapping[str, str] = field(default_factory=dict)
    file: str = ""                 # the platform file the figures come from (what a report says it used)

    @property
    def j_per_byte(self) -> float:
        """J per byte of device-memory traffic, its on-chip path included."""
        return self.dram_j_per_byte + self.onchip_j_per_byte

    def flop_energy(self, dtype: str, device: Device | None = None) -> float:
        """J per FLOP in `dtype`. A dtype the file does not list: the math units draw the same power at
        every dtype's dense peak, so e(d) = e(ref) x peak(ref) / peak(d) (needs the device's peaks);
        without a device, the nearest wider listed dtype (hwmodels.device.FALLBACK)."""
        dtype = canonical_dtype(dtype)
        if dtype in self.flop_j:
            return self.flop_j[dtype]
        ref = next(iter(self.flop_j))
        if device is not None:
            return self.flop_j[ref] * device.peak_flops(ref) / device.peak_flops(dtype)
        for wider in FALLBACK.get(dtype, ()):
            if wider in self.flop_j:
                return self.flop_j[wider]
        return self.flop_j[ref]


@dataclass(frozen=True)
class Price:
    usd_per_hour: float            # per device-hour
    date: str
    source: str
    file: str = ""                 # the platform file it comes from


def _device(device) -> Device:
    """A Device (or any object with its `name` and `source_path`, e.g. a test double), or a name/path to load."""
    if isinstance(device, (str, Path)):
        return load_device(device)
    return device


def platform_paths(device) -> list[Path]:
    """Platform files of a device, most specific first: `<stem>.platform.yaml` next to its device file,
    then the shipped `hwmodels/platform/<name>.yaml`; only those that exist."""
    dev = _device(device)
    out = []
    if dev.source_path:
        source = Path(dev.source_path)
        out.append(source.with_name(f"{source.stem}.platform.yaml"))
    out.append(PLATFORM_DIR / f"{dev.name}.yaml")
    return [p for p in out if p.is_file()]


_cache: dict[tuple, dict] = {}


def _read(path: Path) -> dict:
    stat = path.stat()
    key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    if key not in _cache:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise HardwareFileError(path, None, f"cannot read: {exc}") from None
        _cache[key] = load_yaml(text, path)
    return _cache[key]


def _section(device, name: str) -> tuple[dict, Path] | None:
    """(mapping, file) of a section from the most specific platform file that has it; None when none does."""
    dev = _device(device)
    for path in platform_paths(dev):
        data = _read(path)
        _check_platform_file(data, path, dev.name)
        if name in data:
            return data[name], path
    return None


def _check_platform_file(data: dict, path: Path, name: str) -> None:
    for key in data:
        if key not in ("schema_version", "device", *SECTIONS):
            raise HardwareFileError(path, key, f"unknown field; allowed here: schema_version, device, {', '.join(SECTIONS)}")
    if data.get("schema_version") != SCHEMA_VERSION:
        raise HardwareFileError(path, "schema_version", f"expected {SCHEMA_VERSION}, got {data.get('schema_version')!r}")
    if data.get("device") != name:
        raise HardwareFileError(path, "device", f"names {data.get('device')!r}, not the device {name!r}")


class _Fields:
    """Readers of `{value, unit, source}` entries of one section; problems name the file and field."""

    def __init__(self, mapping, path: Path, section: str):
        if not isinstance(mapping, dict):
            raise HardwareFileError(path, section, "expected a mapping")
        self.m, self.path, self.section, self.sources = mapping, path, section, {}

    def fail(self, key, problem):
        raise HardwareFileError(self.path, f"{self.section}.{key}", problem)

    def allow(self, required, optional=()):
        for key in self.m:
            if key not in required and key not in optional:
                self.fail(key, f"unknown field; allowed here: {', '.join((*required, *optional))}")
        for key in required:
            if key not in self.m:
                self.fail(key, "missing required field")

    def text(self, key):
        value = self.m[key]
        if not isinstance(value, str) or not value.strip():
            self.fail(key, f"expected non-empty text, got {value!r}")
        return value.strip()

    def quantity(self, key, units=None, kind=None, mapping=None, label=None, extra=(), zero=False):
        entry = (self.m if mapping is None else mapping)[key]
        label = label or key
        if not isinstance(entry, dict):
            self.fail(label, "expected {value, unit, source}")
        for k in entry:
            if k not in ("value", "unit", "source", *extra):
                self.fail(f"{label}.{k}", "unknown field; allowed here: value, unit, source" +
                          "".join(f", {e}" for e in extra))
        value = entry.get("value")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0 \
                or (value == 0 and not zero):
            self.fail(f"{label}.value", f"expected a {'finite number >= 0' if zero else 'positive finite number'}, "
                                        f"got {value!r}")
        source = entry.get("source")
        if not isinstance(source, str) or not source.strip():
            self.fail(f"{label}.source", "missing source (every number needs one)")
        unit = entry.get("unit")
        if kind is not None:
            try:
                base = to_base(value, unit, kind)
            except UnitError as exc:
                self.fail(f"{label}.unit", str(exc))
        elif units is None:                 # a plain count or fraction: no unit
            if unit is not None:
                self.fail(f"{label}.unit", "this quantity takes no unit")
            base = float(value)
        else:
            if unit not in units:
                self.fail(f"{label}.unit", f"unknown unit {unit!r}; expected one of {', '.join(units)}")
            base = float(value) * units[unit]
        self.sources[label] = source.strip()
        return base


def load_interconnect(device) -> Interconnect | None:
    """The device's interconnect, or None when no file describes it."""
    found = _section(device, "interconnect")
    if found is None:
        return None
    f = _Fields(found[0], found[1], "interconnect")
    keys = ("kind", "topology", "max_devices", "per_direction_bandwidth", "achievable_fraction", "latency")
    f.allow(keys, ("description", "aggregate_bandwidth"))
    topology = f.text("topology")
    if topology not in TOPOLOGIES:
        f.fail("topology", f"expected one of {', '.join(TOPOLOGIES)}, got {topology!r}")
    max_devices = f.quantity("max_devices")
    if max_devices != int(max_devices):
        f.fail("max_devices.value", f"expected a whole number of devices, got {max_devices}")
    per_direction = f.quantity("per_direction_bandwidth", kind="bandwidth")
    aggregate = f.quantity("aggregate_bandwidth", kind="bandwidth") if "aggregate_bandwidth" in f.m else 2 * per_direction
    fraction = f.quantity("achievable_fraction")
    if fraction > 1:
        f.fail("achievable_fraction.value", f"a fraction must be in (0, 1], got {fraction}")
    if per_direction > aggregate:
        f.fail("per_direction_bandwidth", "exceeds aggregate_bandwidth")
    return Interconnect(kind=f.text("kind"), description=f.text("description") if "description" in f.m else "",
                        topology=topology, max_devices=int(max_devices), aggregate_bw=aggregate,
                        per_direction_bw=per_direction, achievable_fraction=fraction,
                        latency_s=f.quantity("latency", kind="time"), sources=MappingProxyType(f.sources))


def load_energy(device) -> Energy | None:
    """The device's energy figures, or None when no file describes them."""
    found = _section(device, "energy")
    if found is None:
        return None
    f = _Fields(found[0], found[1], "energy")
    f.allow(("dram_energy", "flop_energy", "static_power"), ("memory_kind", "tdp", "onchip_energy"))
    per_byte = {**{u: v * 8 for u, v in ENERGY_PER_BIT.items()}, **ENERGY_PER_BYTE}
    flops = f.m["flop_energy"]
    if not isinstance(flops, dict) or not flops:
        f.fail("flop_energy", "expected a mapping of dtype -> {value, unit, source}")
    flop_j = {}
    for dtype in flops:
        if dtype not in DTYPES:
            f.fail(f"flop_energy.{dtype}", f"unknown dtype; expected one of {', '.join(DTYPES)}")
        flop_j[dtype] = f.quantity(dtype, ENERGY_PER_OP, mapping=flops, label=f"flop_energy.{dtype}")
    return Energy(memory_kind=f.text("memory_kind") if "memory_kind" in f.m else "",
                  dram_j_per_byte=f.quantity("dram_energy", per_byte),
                  onchip_j_per_byte=f.quantity("onchip_energy", per_byte, zero=True) if "onchip_energy" in f.m else 0.0,
                  flop_j=MappingProxyType(flop_j), static_w=f.quantity("static_power", POWER),
                  tdp_w=f.quantity("tdp", POWER) if "tdp" in f.m else None, sources=MappingProxyType(f.sources),
                  file=str(found[1]))


def default_price(device) -> Price | None:
    """The device's documented hourly price (USD per device-hour), or None when no file gives one."""
    found = _section(device, "price")
    if found is None:
        return None
    f = _Fields(found[0], found[1], "price")
    f.allow(("hourly",))
    value = f.quantity("hourly", PRICE, extra=("date",))
    date = f.m["hourly"].get("date")
    if not isinstance(date, str) or not date.strip():
        f.fail("hourly.date", "missing date (prices change: say when this one held)")
    return Price(usd_per_hour=value, date=date.strip(), source=f.sources["hourly"], file=str(found[1]))
