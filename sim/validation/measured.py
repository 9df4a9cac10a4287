"""Measured timing folders (written by `python -m traces.timing`) as validation points.

A timing folder holds manifest.json (kind "kvsim-timing"), config.json and timing.parquet (see
traces/timing.py). Every folder under traces/data/ whose manifest says kind "kvsim-timing" enters the
report, CPU or GPU alike: the manifest names the hardware file (`hw_device`) the points are predicted on.
Reading them needs no torch.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

TIMING_KIND = "kvsim-timing"
DATA_DIR = Path(__file__).resolve().parents[2] / "traces" / "data"
REQUIRED = ("phase", "policy", "cache_ratio", "batch", "context", "kv_tokens", "slots", "median_s")


@dataclass
class TimingSource:
    path: Path
    manifest: dict
    table: pd.DataFrame

    @property
    def name(self) -> str:
        """Source label: the folder relative to traces/data when it lives there (e.g. cpu/gpt2-small-rand)."""
        try:
            return self.path.resolve().relative_to(DATA_DIR).as_posix()
        except ValueError:
            return self.path.name

    @property
    def origin(self) -> str:
        """Where the points come from: the first folder level under traces/data (cpu, h200, ...)."""
        return self.name.split("/")[0] if "/" in self.name else self.manifest.get("device", self.name)

    @property
    def hw(self) -> str:
        """hwmodels device name, or a hardware YAML path (stored relative to the timing folder)."""
        hw = self.manifest["hw_device"]
        if hw.endswith((".yaml", ".yml")):
            return str((self.path / hw).resolve())
        return hw

    @property
    def hw_display(self) -> str:
        """`hw` for tables and reports: a path inside the repository is shown relative to it, so committed
        outputs name no path of one machine."""
        hw = Path(self.hw)
        repo = Path(__file__).resolve().parents[2]
        return str(hw.relative_to(repo)) if hw.is_absolute() and hw.is_relative_to(repo) else self.hw

    @property
    def hw_label(self) -> str:
        return Path(self.manifest["hw_device"]).stem

    @property
    def model_config(self) -> Path:
        return self.path / "config.json"

    @property
    def dtype(self) -> str:
        return self.manifest.get("dtype", "fp32")

    @property
    def beams(self) -> int:
        """Beam width of the measured steps (traces.timing --stack hf --beams; 1 for the project's stack)."""
        return int(self.manifest.get("beams", 1))

    @property
    def profile(self) -> str:
        # The code traces.timing measures is this project's slot-cache stack on eager PyTorch.
        return self.manifest.get("software", "kvsim-eager")


def read_record(path: Path, kind: str | None = None, what: str = "") -> dict:
    """A JSON record (manifest.json, run.json) as a dict; with `kind`, it must say that kind.
    Raises ValueError (one line naming the file) when it is unreadable, not an object, or of another kind."""
    try:
        record = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: unreadable ({exc})") from None
    if not isinstance(record, dict):
        raise ValueError(f"{path}: unreadable (not a JSON object)")
    if kind is not None and record.get("kind") != kind:
        raise ValueError(f"{path}: not {what or 'a record'} of kind {kind!r} (kind {record.get('kind')!r})")
    return record


def find_timing_folders(roots=None) -> list[Path]:
    """Timing folders at or under each root (default traces/data/), sorted."""
    roots = [Path(r) for r in roots] if roots else [DATA_DIR]
    found = []
    for root in roots:
        if not root.exists():
            raise FileNotFoundError(f"measured folder {root} not found")
        manifests = [root / "manifest.json"] if (root / "manifest.json").is_file() else sorted(root.glob("**/manifest.json"))
        for manifest in manifests:
            if read_record(manifest).get("kind") == TIMING_KIND:
                found.append(manifest.parent)
        if roots != [DATA_DIR] and not any(str(f).startswith(str(root)) for f in found):
            raise ValueError(f"{root}: no timing folder (manifest.json of kind {TIMING_KIND!r}) found there")
    return sorted(set(found))


def load_timing(path) -> TimingSource:
    path = Path(path)
    manifest = read_record(path / "manifest.json", TIMING_KIND, "a timing manifest")
    if "hw_device" not in manifest:
        raise ValueError(f"{path / 'manifest.json'}: no hw_device (the hardware file to predict on)")
    if not (path / "config.json").is_file():
        raise ValueError(f"{path}: config.json missing (the model shape the points were measured on)")
    try:
        table = pd.read_parquet(path / "timing.parquet")
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path / 'timing.parquet'}: unreadable ({str(exc).splitlines()[0]})") from None
    missing = [c for c in REQUIRED if c not in table.columns]
    if missing:
        raise ValueError(f"{path / 'timing.parquet'}: missing column(s) {', '.join(missing)}")
    return TimingSource(path, manifest, table)
