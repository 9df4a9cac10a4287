"""The timing-folder format (torch-free): written by `python -m traces.timing` (and workflows/gpu's ingest),
read by sim.validate. One module for both sides, beside the trace reader, so they cannot drift apart.

A timing folder holds
  manifest.json   kind "kvsim-timing": model, environment, grid settings, and `hw_device`, the hwmodels file
                  (name, or a YAML path relative to the folder) the points are predicted on
  config.json     the HF config the model was built from (the model shape the simulator reads)
  timing.parquet  one row per point (TIMING_COLUMNS), also timing.csv for humans and diffs
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from kvcommon.cli import atomic_write_text, atomic_writer
from traces.assets import DATA_DIR, REPO_ROOT
from traces.schema import TIMING_KIND

SCHEMA_VERSION = 1

KIND = TIMING_KIND        # traces.schema: the kinds of bundled folders, defined once

# One row per measured point. `kv_tokens` is what the simulator is fed: the mean number of tokens held per
# (request, KV head), averaged over layers and the timed steps, read from the policy (not assumed).
# `slots` is the cache buffer length attention actually ran over (>= kv_tokens: the slot cache keeps free
# slots for growth and for the incoming token).
KEY_COLUMNS = ("phase", "policy", "cache_ratio", "batch", "context")
# With --rounds, the statistics are over the samples of every round (`rounds` of them so far); the raw
# samples are kept (`samples_s`, `cpu_samples_s`: space-separated, `repeats` per round, round after round)
# so a resumed run can add rounds and recompute them; `round_medians_s` shows the drift between rounds.
TIMING_COLUMNS = KEY_COLUMNS + (
    "kv_tokens", "slots", "median_s", "p10_s", "p90_s", "mean_s", "min_s", "cpu_median_s", "peak_mem_bytes",
    "repeats", "warmup", "threads", "omp_wait_policy", "dtype", "load_1min", "measured_at",
    "rounds", "round_medians_s", "samples_s", "cpu_samples_s")
# what a reader needs of a table (older folders lack the round columns)
REQUIRED = ("phase", "policy", "cache_ratio", "batch", "context", "kv_tokens", "slots", "median_s")


class TimingError(ValueError):
    """A user mistake or an unusable output folder: one line, shown as `error: ...` by the CLI."""


# --- rows ----------------------------------------------------------------------------------------------------

def point_key(row: dict) -> tuple:
    """What identifies a point in a folder: (phase, policy, cache_ratio, batch, context)."""
    return (row["phase"], row["policy"], round(float(row["cache_ratio"]), 6), int(row["batch"]), int(row["context"]))


def encode_samples(values) -> str:
    """Samples as text (parquet and csv both keep it): repr round-trips every float exactly."""
    return " ".join(repr(float(v)) for v in values)


def decode_samples(text) -> list[float]:
    return [float(v) for v in text.split()] if isinstance(text, str) else []


def rounds_of(row: dict) -> int:
    """Rounds a row holds; a row written before rounds were recorded holds one."""
    value = row.get("rounds")
    return 1 if value is None or pd.isna(value) else int(value)


def timing_table(rows: list[dict]) -> pd.DataFrame:
    table = pd.DataFrame(rows, columns=list(TIMING_COLUMNS))
    return table.sort_values(["phase", "policy", "cache_ratio", "context", "batch"], ignore_index=True)


# --- the writer ----------------------------------------------------------------------------------------------

@dataclass
class TimingFolder:
    """One model's timing folder: loads finished points, appends new ones atomically."""
    path: Path
    rows: list[dict] = field(default_factory=list)
    manifest: dict = field(default_factory=dict)

    @classmethod
    def open(cls, path: Path, settings: dict, fresh: bool, rounds: int = 1) -> "TimingFolder":
        """Rounds are not a setting that must match: a higher --rounds adds rounds to finished points; a
        lower one is refused (the folder would mix points averaged over different numbers of rounds)."""
        folder = cls(Path(path))
        manifest_path = folder.path / "manifest.json"
        if fresh or not manifest_path.exists():
            return folder
        try:
            manifest = json.loads(manifest_path.read_text())
            table = pd.read_parquet(folder.path / "timing.parquet")
        except (OSError, ValueError) as exc:
            raise TimingError(f"{folder.path}: existing timing folder is unreadable ({exc}); "
                              "rerun with --fresh to start over") from None
        previous = manifest.get("grid_settings", {})
        # both ways: a setting only one side records (e.g. the HF stack's) is a difference too
        changed = {k: (previous.get(k), settings.get(k)) for k in dict.fromkeys([*settings, *previous])
                   if previous.get(k) != settings.get(k)}
        if changed:
            what = ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in changed.items())
            raise TimingError(f"{folder.path} was measured under other settings ({what}); "
                              "rerun with the same settings or with --fresh")
        before = int(manifest.get("rounds", 1))
        if rounds < before:
            raise TimingError(f"{folder.path} was measured with --rounds {before}; rerun with --rounds >= {before} "
                              "or with --fresh")
        folder.rows = table.to_dict("records")
        if rounds > 1 and any(not isinstance(r.get("samples_s"), str) for r in folder.rows):
            raise TimingError(f"{folder.path} holds points measured before samples were stored: more rounds "
                              "cannot be added to them; rerun with --fresh")
        folder.manifest = manifest
        return folder

    def done(self, rounds: int = 1) -> set[tuple]:
        """Keys of the points that hold at least `rounds` rounds."""
        return {point_key(r) for r in self.rows if rounds_of(r) >= rounds}

    def row(self, point: dict) -> dict | None:
        return next((r for r in self.rows if point_key(r) == point_key(point)), None)

    def add(self, row: dict) -> None:
        self.rows = [r for r in self.rows if point_key(r) != point_key(row)] + [row]

    def write(self, manifest: dict, config: dict) -> None:
        """manifest.json, config.json, timing.parquet and timing.csv, each via a temp file + os.replace."""
        self.path.mkdir(parents=True, exist_ok=True)
        table = timing_table(self.rows)
        atomic_writer(self.path / "timing.parquet", lambda p: table.to_parquet(p, index=False))
        atomic_writer(self.path / "timing.csv", lambda p: table.to_csv(p, index=False, float_format="%.6g"))
        atomic_write_text(self.path / "config.json", json.dumps(config, indent=2) + "\n")
        manifest = manifest | {"points": len(table)}
        atomic_write_text(self.path / "manifest.json", json.dumps(manifest, indent=2) + "\n")
        self.manifest = manifest


# --- the reader ----------------------------------------------------------------------------------------------

@dataclass
class TimingSource:
    """A timing folder as validation points: its manifest, its table, and what the simulator needs of them."""
    path: Path
    manifest: dict
    table: pd.DataFrame
    data_root: Path = DATA_DIR      # names are relative to it (traces/data unless a caller says otherwise)

    @property
    def name(self) -> str:
        """Source label: the folder relative to traces/data when it lives there (e.g. cpu/gpt2-small-rand)."""
        try:
            return self.path.resolve().relative_to(self.data_root).as_posix()
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
        return str(hw.relative_to(REPO_ROOT)) if hw.is_absolute() and hw.is_relative_to(REPO_ROOT) else self.hw

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


def find_timing_folders(roots=None, data_root: Path = DATA_DIR) -> list[Path]:
    """Timing folders at or under each root (default: the bundled ones under `data_root`), sorted."""
    if not roots:
        from traces.catalog import catalog
        if not Path(data_root).exists():
            raise FileNotFoundError(f"measured folder {data_root} not found")
        return list(catalog(data_root).timing)
    found = []
    for root in map(Path, roots):
        if not root.exists():
            raise FileNotFoundError(f"measured folder {root} not found")
        manifests = [root / "manifest.json"] if (root / "manifest.json").is_file() else sorted(root.glob("**/manifest.json"))
        for manifest in manifests:
            if read_record(manifest).get("kind") == KIND:
                found.append(manifest.parent)
        if not any(str(f).startswith(str(root)) for f in found):
            raise ValueError(f"{root}: no timing folder (manifest.json of kind {KIND!r}) found there")
    return sorted(set(found))


def load_timing(path, data_root: Path = DATA_DIR) -> TimingSource:
    """A timing folder, checked: a timing manifest naming its hardware, config.json, a table with REQUIRED."""
    path = Path(path)
    manifest = read_record(path / "manifest.json", KIND, "a timing manifest")
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
    return TimingSource(path, manifest, table, Path(data_root))
