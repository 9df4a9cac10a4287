"""Accelerator names as published tables print them ("H100 SXM5 80GB", "A100-SXM-80GB (assumed)", "H100 PCIe")
-> the shipped hardware file of that part, or None with the reason (hwmodels/sku-names.yaml holds the rules)."""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

import yaml

SKU_FILE = Path(__file__).with_name("sku-names.yaml")


def list_devices() -> list[str]:
    """The shipped hardware files' names (registry.list_devices, which imports this module: no cycle)."""
    return sorted(p.stem for p in SKU_FILE.with_name("devices").glob("*.y*ml"))


@lru_cache(maxsize=1)
def _rules() -> tuple[tuple[re.Pattern, str | None, str], ...]:
    try:
        data = yaml.safe_load(SKU_FILE.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"{SKU_FILE}: not readable ({str(exc).splitlines()[0]})") from None
    rules = []
    devices = set(list_devices())
    for i, rule in enumerate((data or {}).get("rules") or [], start=1):
        device = rule.get("device")
        if device is not None and device not in devices:
            raise ValueError(f"{SKU_FILE}: rule {i} names {device!r}, not a shipped hardware file")
        try:
            pattern = re.compile(str(rule["match"]), re.IGNORECASE)
        except (KeyError, re.error) as exc:
            raise ValueError(f"{SKU_FILE}: rule {i} has no valid 'match' ({exc})") from None
        rules.append((pattern, device, str(rule.get("why", ""))))
    return tuple(rules)


def resolve_sku(label: str) -> tuple[str | None, str]:
    """(hardware file name or None, why): a shipped file's own name is itself; else the first rule that
    matches the label; no rule: None."""
    text = str(label).strip()
    if text.lower() in set(list_devices()):
        return text.lower(), "hardware file name"
    for pattern, device, why in _rules():
        if pattern.search(text):
            return device, why
    return None, f"no hardware file for {text!r} (rules: hwmodels/sku-names.yaml; files: {', '.join(list_devices())})"
