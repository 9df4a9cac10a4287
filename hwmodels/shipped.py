"""Where the shipped hardware files live and their names (hwmodels.registry loads them; hwmodels.skus maps
published accelerator names onto them)."""
from __future__ import annotations

from pathlib import Path

DEVICES_DIR = Path(__file__).resolve().parent / "devices"
SUFFIXES = (".yaml", ".yml")


def list_devices() -> list[str]:
    """Names of the shipped hardware files, sorted."""
    return sorted(p.stem for p in DEVICES_DIR.iterdir() if p.suffix in SUFFIXES and p.is_file())
