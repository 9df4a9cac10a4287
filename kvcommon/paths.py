"""Where a package's files are, found without importing it (its data folders, e.g. sim/models/*.json),
so a lower layer can read an upper layer's shipped data without an import edge."""
from __future__ import annotations

import importlib.util
from pathlib import Path


def package_dir(name: str) -> Path | None:
    """The folder of top-level package `name` (not imported), None when it is not installed."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))
