"""Finding and loading hardware files: shipped names (hwmodels/devices/*.yaml) or paths."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from .device import Device
from .errors import HardwareFileError
from .schema import load_yaml, parse
from .shipped import DEVICES_DIR, SUFFIXES, list_devices
from .skus import rule_for

__all__ = ["DEVICES_DIR", "SUFFIXES", "list_devices", "resolve", "load_device"]

# (resolved path, mtime_ns, size) -> Device; sweeps load the same file many times.
_cache: dict[tuple, Device] = {}


def resolve(name_or_path) -> Path:
    """A shipped device name, or a path to a YAML file -> the file's path."""
    text = str(name_or_path).strip()
    looks_like_path = os.sep in text or "/" in text or text.endswith(SUFFIXES)
    if not looks_like_path:
        for suffix in SUFFIXES:
            candidate = DEVICES_DIR / f"{text}{suffix}"
            if candidate.is_file():
                return candidate
        if Path(text).is_file():
            return Path(text)
        # a name as published tables print it ("H100 SXM5 80GB"): hwmodels/sku-names.yaml's rules
        rule = rule_for(text)
        if rule is not None and rule[0] is not None:
            return DEVICES_DIR / f"{rule[0]}.yaml"
        hint = "" if rule is None else f" ({rule[1]})"
        raise HardwareFileError(text, None, f"unknown device name{hint}; shipped devices: "
                                + ", ".join(list_devices()) + " (or give a path to a .yaml file)")
    path = Path(text).expanduser()
    if not path.exists():
        shipped = DEVICES_DIR / path.name
        if path.name == text and shipped.is_file():  # "h200-sxm.yaml" means the shipped file
            return shipped
        raise HardwareFileError(path, None, "file not found")
    if not path.is_file():
        raise HardwareFileError(path, None, "not a file")
    return path


def load_device(name_or_path) -> Device:
    """Load and validate a hardware file; raises HardwareFileError with one clear line."""
    if isinstance(name_or_path, Device):
        return name_or_path
    path = resolve(name_or_path)
    try:
        stat = path.stat()
        key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
        if key in _cache:
            return _cache[key]
        raw = path.read_bytes()
    except OSError as exc:
        raise HardwareFileError(path, None, f"cannot read: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise HardwareFileError(path, None, "not UTF-8 text") from None
    parsed = parse(load_yaml(text, path), path)
    device = Device(
        name=parsed.name, description=parsed.description, memory_bytes=parsed.memory_bytes,
        memory_bw=parsed.memory_bw, flops=parsed.flops, bw_curve=parsed.bw_curve,
        compute_curve=parsed.compute_curve, launch_overhead_s=parsed.launch_overhead_s,
        host_overhead_s=parsed.host_overhead_s,
        content_hash=hashlib.sha256(raw).hexdigest()[:16], source_path=str(path),
        sources=parsed.sources, notes=parsed.notes, calibration=parsed.calibration,
        compute_reference_dtype=parsed.compute_reference_dtype,
        tables=parsed.tables)
    _cache[key] = device
    return device
