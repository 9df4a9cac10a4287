"""The one catalog of the bundled data under traces/data/ (torch-free): trace folders, timing folders and
quality reports, found by one walk over the manifests and told apart by their `kind`.

    import traces
    cat = traces.catalog()
    cat.traces            # [Path(.../smollm2-135m/xsum), ...]   kind "kvsim-trace"
    cat.timing            # [Path(.../cpu/gpt2-small-rand), ...]  kind "kvsim-timing"
    cat.quality_reports   # [Path(.../quality/quality.csv), ...]  combined and per-trace reports
    cat.trace("smollm2-135m/xsum"), cat.name(path)               # a folder by name, a folder's name
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from traces.assets import DATA_DIR
from traces.schema import KIND as TRACE_KIND, QUALITY_DIR, TIMING_KIND

QUALITY_FILE = "quality.csv"    # what traces.quality writes into a quality/ folder


def manifest_kind(folder: Path) -> str | None:
    """The `kind` of folder/manifest.json, None when there is none or it is unreadable."""
    try:
        record = json.loads((Path(folder) / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    return record.get("kind") if isinstance(record, dict) else None


@dataclass(frozen=True)
class Catalog:
    root: Path
    traces: tuple[Path, ...]
    timing: tuple[Path, ...]
    quality_reports: tuple[Path, ...]

    def of_kind(self, kind: str) -> tuple[Path, ...]:
        return {TRACE_KIND: self.traces, TIMING_KIND: self.timing}.get(kind, ())

    def name(self, path) -> str:
        """A folder's name: its path below the root (`smollm2-135m/xsum`), else its own name."""
        try:
            return Path(path).resolve().relative_to(self.root.resolve()).as_posix()
        except ValueError:
            return Path(path).name

    def trace(self, name: str) -> Path:
        """The trace folder of this name; FileNotFoundError listing the names there are."""
        names = [self.name(p) for p in self.traces]
        if name not in names:
            raise FileNotFoundError(f"no bundled trace {name!r} (have {', '.join(names) or 'none'})")
        return self.root / name


def catalog(root=None) -> Catalog:
    """What is bundled under `root` (default traces/data/). os.walk, not Path.glob: it skips entries that
    vanish while it looks (a capture writing its temporary shards next door) instead of failing."""
    root = Path(root) if root is not None else DATA_DIR
    found = {TRACE_KIND: [], TIMING_KIND: []}
    reports = []
    for folder, _, files in os.walk(root):
        folder = Path(folder)
        if "manifest.json" in files:
            kind = manifest_kind(folder)
            if kind in found:
                found[kind].append(folder)
        if folder.name == QUALITY_DIR and QUALITY_FILE in files:
            reports.append(folder / QUALITY_FILE)
    return Catalog(root, tuple(sorted(found[TRACE_KIND])), tuple(sorted(found[TIMING_KIND])), tuple(sorted(reports)))
