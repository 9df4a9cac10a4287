"""Accelerator names as published tables print them ("H100 SXM5 80GB", "A100-SXM-80GB (assumed)", "H100 PCIe")
-> the shipped hardware file of that part, or None with the reason (hwmodels/sku-names.yaml holds the rules)."""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

import yaml

from .shipped import list_devices

SKU_FILE = Path(__file__).with_name("sku-names.yaml")


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


def rule_for(label: str) -> tuple[str | None, str] | None:
    """(hardware file name or None, why) of the first rule that matches the label; None when none does."""
    text = str(label).strip()
    return next(((device, why) for pattern, device, why in _rules() if pattern.search(text)), None)


def resolve_sku(label: str) -> tuple[str | None, str]:
    """(hardware file name or None, why): a shipped file's own name is itself; else the first rule that
    matches the label (rule_for); no rule: None."""
    text = str(label).strip()
    if text.lower() in set(list_devices()):
        return text.lower(), "hardware file name"
    rule = rule_for(text)
    if rule is not None:
        return rule
    return None, f"no hardware file for {text!r} (rules: hwmodels/sku-names.yaml; files: {', '.join(list_devices())})"
