"""Measured timing folders (written by `python -m traces.timing`) as validation points.

The format, its reader and its writer are one torch-free module, traces.timing_format; the bundled folders
are the ones traces.catalog() lists (every folder under traces/data/ whose manifest says kind
"kvsim-timing", CPU or GPU alike: the manifest names the hardware file the points are predicted on).
This module only says where sim looks (DATA_DIR, patched by tests).
"""
from __future__ import annotations

from pathlib import Path

from traces import timing_format
from traces.catalog import DATA_DIR
from traces.timing_format import KIND as TIMING_KIND, REQUIRED, TimingSource, read_record

__all__ = ["DATA_DIR", "REQUIRED", "TIMING_KIND", "TimingSource", "find_timing_folders", "load_timing", "read_record"]


def find_timing_folders(roots=None) -> list[Path]:
    """Timing folders at or under each root (default: the bundled ones, traces.catalog()), sorted."""
    return timing_format.find_timing_folders(roots, data_root=DATA_DIR)


def load_timing(path) -> TimingSource:
    return timing_format.load_timing(path, data_root=DATA_DIR)
