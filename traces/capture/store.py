"""Writing a trace folder so that an interrupted capture keeps what it finished.

Each run (sample x policy x cache ratio) lands in its own shard folder `shards/<key>/`, written into a
temporary folder then renamed (os.replace), so a shard is either complete or absent. `consolidate` joins
the shards, in the capture's fixed run order, into the four tables (each written tmp + os.replace), then
writes the manifest with `complete: true` and row counts (the reader uses them to spot truncation), and
removes the shards.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from traces import schema

SHARDS = "shards"
CAPTURE_CONFIG = "capture.json"  # the settings of the capture in progress: a resume must match them


def shard_key(label: str, cache_ratio: float, sample_id: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.=-]+", "_", f"{label}__r{cache_ratio:.4f}__{sample_id}")
    return safe


def shard_done(out: Path, key: str) -> bool:
    return (out / SHARDS / key / "text.json").exists()


def write_shard(out: Path, key: str, result) -> None:
    final = out / SHARDS / key
    tmp = out / SHARDS / f".{key}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    _write_table(result.kv, schema.KV_SCHEMA, tmp / schema.KV)
    _write_table(result.kept, schema.KEPT_SCHEMA, tmp / schema.KEPT)
    _write_table(result.steps, schema.STEPS_SCHEMA, tmp / schema.STEPS)
    (tmp / "text.json").write_text(json.dumps(result.text))  # written last: marks the shard complete
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)


def _write_table(frame: pd.DataFrame, table_schema: pa.Schema, path: Path) -> None:
    table = pa.Table.from_pandas(frame[[f.name for f in table_schema]], schema=table_schema, preserve_index=False)
    pq.write_table(table, path, compression="zstd")


def _replace_parquet(tables: list[pa.Table], table_schema: pa.Schema, path: Path) -> int:
    table = pa.concat_tables(tables) if tables else table_schema.empty_table()
    tmp = path.with_name(path.name + ".tmp")
    # Dictionary-encoded, zstd: the repeated ids, ratios and lengths of a trace shrink to a few bytes a row.
    pq.write_table(table, tmp, compression="zstd", use_dictionary=True)
    os.replace(tmp, path)
    return table.num_rows


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str) + "\n")
    os.replace(tmp, path)


# A resume may ask for more or fewer samples: shards are per sample, so only the rest must match.
SAMPLE_KEYS = ("n", "sample_ids")


def _same_capture(a: dict, b: dict) -> bool:
    return {k: v for k, v in a.items() if k not in SAMPLE_KEYS} == {k: v for k, v in b.items() if k not in SAMPLE_KEYS}


def check_resume(out: Path, settings: dict) -> bool:
    """True when `out` holds shards of the same capture; error when it holds a different one."""
    path = out / CAPTURE_CONFIG
    if not path.exists():
        if (out / schema.MANIFEST).exists():
            manifest = json.loads((out / schema.MANIFEST).read_text())
            if manifest.get("capture") == settings and manifest.get("complete"):
                return True
            raise ValueError(f"{out} already holds a finished trace with other settings "
                             "(choose a new --out, or --overwrite)")
        return False
    previous = json.loads(path.read_text())
    if not _same_capture(previous, settings) and not any((out / SHARDS).glob("*/text.json")):
        return False  # nothing was finished under the old settings: start afresh
    if not _same_capture(previous, settings):
        changed = sorted(k for k in set(previous) | set(settings) if previous.get(k) != settings.get(k))
        raise ValueError(f"{out} holds an unfinished capture with other settings ({', '.join(changed)} differ); "
                         "rerun with the same flags to resume, or pass --overwrite")
    return True


def round_mass(table: pa.Table) -> pa.Table:
    """mass_retained to 1e-4: far below any effect it measures, and it lets Parquet's dictionary encoding
    shrink the largest column of a trace 2.5-fold (what keeps the bundled traces at a few MB)."""
    index = table.schema.get_field_index("mass_retained")
    rounded = pa.array(np.round(table.column(index).to_numpy(), 4).astype(np.float32))
    return table.set_column(index, "mass_retained", rounded)


def consolidate(out: Path, keys: list[str], manifest: dict) -> dict:
    kv, kept, steps, texts = [], [], [], []
    for key in keys:
        shard = out / SHARDS / key
        kv.append(round_mass(pq.read_table(shard / schema.KV)))
        kept.append(pq.read_table(shard / schema.KEPT))
        steps.append(pq.read_table(shard / schema.STEPS))
        texts.append(json.loads((shard / "text.json").read_text()))
    rows = {
        schema.KV: _replace_parquet(kv, schema.KV_SCHEMA, out / schema.KV),
        schema.KEPT: _replace_parquet(kept, schema.KEPT_SCHEMA, out / schema.KEPT),
        schema.STEPS: _replace_parquet(steps, schema.STEPS_SCHEMA, out / schema.STEPS),
    }
    tmp = out / (schema.TEXTS + ".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for record in texts:
            fh.write(json.dumps(record, ensure_ascii=False) + "\n")
    os.replace(tmp, out / schema.TEXTS)
    rows[schema.TEXTS] = len(texts)
    manifest = {**manifest, "rows": rows, "complete": True}
    write_json(out / schema.MANIFEST, manifest)
    shutil.rmtree(out / SHARDS, ignore_errors=True)
    (out / CAPTURE_CONFIG).unlink(missing_ok=True)
    return manifest
