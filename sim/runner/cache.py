"""The per-point result cache: immutable Parquet shards, written atomically, in one folder per namespace."""
from __future__ import annotations

import os
import time
import uuid
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

KEY_HI, KEY_LO = "_key_hi", "_key_lo"


class ResultCache:
    """Per-point results on disk, as immutable Parquet shards in one folder per (function, code, context)."""

    def __init__(self, root: str | os.PathLike, namespace: str):
        self.dir = Path(root) / namespace
        self.dir.mkdir(parents=True, exist_ok=True)
        self.unreadable: list[Path] = []     # shards load() could not read: replaced by drop_unreadable()

    def shards(self) -> list[Path]:
        return sorted(self.dir.glob("shard-*.parquet"))

    def load(self, wanted_hi: np.ndarray | None = None) -> pd.DataFrame:
        """All cached rows (optionally only those whose key is in ``wanted_hi``), one row per key."""
        frames = []
        for path in self.shards():
            try:
                frame = pd.read_parquet(path)
            except FileNotFoundError:  # compacted away by a concurrent run: its rows are in a new shard
                continue
            except Exception as exc:  # a shard can only be corrupt if edited by hand: recompute its points
                warnings.warn(f"ignoring unreadable cache shard {path}: {exc}; its points are recomputed "
                              "and the shard replaced")
                if path not in self.unreadable:
                    self.unreadable.append(path)
                continue
            frames.append(frame)
        if not frames:
            return pd.DataFrame({KEY_HI: np.array([], np.uint64), KEY_LO: np.array([], np.uint64)})
        table = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
        if wanted_hi is not None:  # one hash-table pass (pandas isin), not one per shard
            table = table[table[KEY_HI].isin(pd.Index(wanted_hi).unique())]
        return table.drop_duplicates([KEY_HI, KEY_LO], ignore_index=True)

    def store(self, hi: np.ndarray, lo: np.ndarray, outputs: pd.DataFrame) -> Path:
        """Write one finished chunk as a new shard, atomically (tmp file + rename)."""
        frame = outputs.reset_index(drop=True).copy()
        frame.insert(0, KEY_LO, np.asarray(lo, np.uint64))
        frame.insert(0, KEY_HI, np.asarray(hi, np.uint64))
        path = self.dir / f"shard-{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.parquet"
        _atomic_parquet(frame, path)
        return path

    def drop_unreadable(self) -> None:
        """Remove the unreadable shards load() met, once the run has stored its points in new shards
        (written atomically): nothing readable is lost, and the next run neither warns nor recomputes."""
        for path in self.unreadable:
            path.unlink(missing_ok=True)
        self.unreadable.clear()

    def compact(self, min_shards: int = 64) -> None:
        """Merge many small shards into one. The merged shard lands before the old ones go, so a crash
        in between leaves duplicates (harmless: ``load`` drops them), never a gap."""
        shards = self.shards()
        if len(shards) < min_shards:
            return
        frames, read = [], []
        for p in shards:
            try:
                frames.append(pd.read_parquet(p))
            except Exception:   # vanished (a concurrent compaction) or unreadable: load() warns about it
                continue
            read.append(p)
        if not frames:
            return
        merged = pd.concat(frames, ignore_index=True).drop_duplicates([KEY_HI, KEY_LO], ignore_index=True)
        _atomic_parquet(merged, self.dir / f"shard-{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.parquet")
        for p in read:
            p.unlink(missing_ok=True)


def _atomic_parquet(frame: pd.DataFrame, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    frame.to_parquet(tmp, index=False)
    os.replace(tmp, path)
