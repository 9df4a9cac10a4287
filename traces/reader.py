"""Reading trace folders (torch-free): `traces.load(dir) -> Trace`.

Every problem with a folder (missing file, unreadable or truncated Parquet, broken JSON, wrong schema
version) raises `TraceError` with one line that names the file, so CLIs can print it and exit 2.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from traces import schema


class TraceError(ValueError):
    """A trace folder is missing, corrupt, truncated or of an unsupported schema version."""


def _read_manifest(folder: Path) -> dict:
    path = folder / schema.MANIFEST
    if not path.exists():
        if (folder / "capture.json").exists():
            raise TraceError(f"{path}: missing, the capture in {folder} is not finished (rerun it to resume)")
        raise TraceError(f"{path}: missing (not a trace folder?)")
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("kind") != schema.KIND:
        raise TraceError(f"{path}: not a kvsim trace manifest (kind != {schema.KIND!r})")
    version = manifest.get("schema_version")
    if not isinstance(version, int):
        raise TraceError(f"{path}: schema_version missing")
    if version > schema.SCHEMA_VERSION:
        raise TraceError(f"{path}: schema_version {version} is newer than this kvsim reads "
                         f"({schema.SCHEMA_VERSION}); update kvsim")
    if manifest.get("complete") is False:
        raise TraceError(f"{path}: capture not finished (rerun the same traces.capture command to resume)")
    return manifest


def _read_parquet(folder: Path, name: str, expected_rows: int | None) -> pd.DataFrame:
    path = folder / name
    if not path.exists():
        raise TraceError(f"{path}: missing")
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TraceError(f"{path}: corrupt or truncated Parquet ({first})") from None
    missing = [c for c in schema.REQUIRED[name] if c not in table.column_names]
    if missing:
        raise TraceError(f"{path}: missing columns {', '.join(missing)}")
    if expected_rows is not None and table.num_rows != expected_rows:
        raise TraceError(f"{path}: {table.num_rows} rows, manifest says {expected_rows} (truncated?)")
    return table.to_pandas()


def _read_texts(folder: Path, expected_rows: int | None) -> pd.DataFrame:
    path = folder / schema.TEXTS
    if not path.exists():
        raise TraceError(f"{path}: missing")
    records = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                raise TraceError(f"{path}: line {lineno} is not valid JSON (truncated?)") from None
    if expected_rows is not None and len(records) != expected_rows:
        raise TraceError(f"{path}: {len(records)} records, manifest says {expected_rows} (truncated?)")
    frame = pd.DataFrame.from_records(records, columns=None if records else list(schema.TEXT_FIELDS))
    missing = [c for c in schema.TEXT_FIELDS if c not in frame.columns]
    if missing:
        raise TraceError(f"{path}: records lack fields {', '.join(missing)}")
    return frame


# What a trace feeds the simulator: its manifest and its KV-length table (the bytes).
HASHED_FILES = (schema.MANIFEST, schema.KV)


def content_hash(folder) -> str:
    """Hash of a trace folder's content as the simulator sees it (HASHED_FILES' bytes), without loading it:
    part of every trace-driven point's cache key, so a recaptured trace invalidates its points."""
    folder = Path(folder)
    digest = hashlib.sha256()
    for name in HASHED_FILES:
        file = folder / name
        if not file.exists():
            raise FileNotFoundError(f"{file}: missing (not a trace folder?)")
        digest.update(name.encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()[:16]


def load(folder) -> Trace:
    """Open a trace folder; TraceError with one line naming the file for anything wrong with it."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise TraceError(f"{folder}: no such trace folder")
    manifest = _read_manifest(folder)
    rows = manifest.get("rows", {})
    kv = _read_parquet(folder, schema.KV, rows.get(schema.KV))
    steps = _read_parquet(folder, schema.STEPS, rows.get(schema.STEPS))
    texts = _read_texts(folder, rows.get(schema.TEXTS))
    if not (folder / schema.KEPT).exists():
        raise TraceError(f"{folder / schema.KEPT}: missing")
    return Trace(folder, manifest, kv, steps, texts)


@dataclass
class Trace:
    """One trace folder in memory. `kept` (positions) and `quality` load on first use."""

    path: Path
    manifest: dict
    kv: pd.DataFrame
    steps: pd.DataFrame
    texts: pd.DataFrame
    _series_cache: dict = field(default_factory=dict, repr=False)

    # ---- what is in it -------------------------------------------------------------------------
    @property
    def model(self) -> dict:
        return self.manifest["model"]

    @cached_property
    def content_hash(self) -> str:
        """The folder's content hash (`content_hash(path)`: manifest.json and kv.parquet, as read from disk)."""
        return content_hash(self.path)

    @cached_property
    def _groups(self) -> dict:
        """(policy, cache_ratio rounded to 1e-4) -> row indices of kv (computed once)."""
        return self.kv.groupby([self.kv["policy"], self.kv["cache_ratio"].astype(float).round(4)]).indices

    @property
    def policies(self) -> list[str]:
        return sorted({policy for policy, _ in self._groups})

    def cache_ratios(self, policy: str) -> list[float]:
        self._check_policy(policy)
        return sorted(float(r) for p, r in self._groups if p == policy)

    @property
    def samples(self) -> list[str]:
        return list(dict.fromkeys(self.kv["sample"]))

    @cached_property
    def kept(self) -> pd.DataFrame:
        return _read_parquet(self.path, schema.KEPT, self.manifest.get("rows", {}).get(schema.KEPT))

    @cached_property
    def quality(self) -> pd.DataFrame | None:
        """quality/quality.csv written by `python -m traces.quality`, or None if it was not run."""
        path = self.path / schema.QUALITY_DIR / schema.QUALITY_CSV
        if not path.exists():
            return None
        try:
            return pd.read_csv(path)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
            raise TraceError(f"{path}: unreadable CSV ({str(exc).splitlines()[0]})") from None

    def summary(self) -> pd.DataFrame:
        """Per policy x cache ratio: mean kept fraction of the full context and mean retained mass."""
        kv = self.kv.copy()
        context = kv["prompt_len"] + kv["step"] + 1  # tokens that exist after step s
        kv["kept_fraction"] = kv["kv_len"] / context
        return (kv.groupby(["policy", "cache_ratio"], as_index=False)
                  .agg(kept_fraction=("kept_fraction", "mean"), mass_retained=("mass_retained", "mean"),
                       samples=("sample", "nunique")))

    def kept_positions(self, sample: str, policy: str, cache_ratio: float, step: int, layer: int,
                       head: int) -> np.ndarray:
        """Sorted original positions one KV head holds after `step`, replayed from the delta encoding."""
        kept = self.kept
        sel = kept[(kept["sample"] == str(sample)) & (kept["policy"] == policy)
                   & np.isclose(kept["cache_ratio"], cache_ratio) & (kept["layer"] == layer)
                   & (kept["head"] == head) & (kept["step"] <= step)].sort_values("step")
        if sel.empty or sel["step"].iloc[0] != schema.PREFILL_STEP:
            raise ValueError(f"no kept positions for sample {sample} {policy} @ {cache_ratio} layer {layer} "
                             f"head {head}")
        first = sel.iloc[0]
        prompt_len = int(self.kv.loc[self.kv["sample"] == str(sample), "prompt_len"].iloc[0])
        bits = np.unpackbits(np.frombuffer(first["kept_bitmap"], dtype=np.uint8))[:prompt_len]
        held = set(np.flatnonzero(bits).tolist())
        for _, row in sel.iloc[1:].iterrows():
            held.update(int(p) for p in row["added"])
            held.difference_update(int(p) for p in row["evicted"])
        return np.array(sorted(held), dtype=np.int64)

    # ---- the simulator seam --------------------------------------------------------------------
    def kv_override(self, policy: str, cache_ratio: float, prompt: int, gen: int, n_layers: int,
                    sample=None, heads: str = "mean") -> np.ndarray:
        """Mean kept tokens per KV head, shape (gen + 1, n_layers), for a target model and request.

        Row r is what decode step r reads: the cache after step r - 1 (row 0 = right after prefill),
        not counting the token step r feeds. `sample=None` averages the per-sample arrays over all
        samples; a sample id picks one. `heads='mean'` averages the KV heads of a layer, `'max'` takes
        the fullest head (what a kernel padded to the longest head pays). The mapping is documented in
        docs/traces.md ("Mapping a trace onto another model").
        """
        per_sample, ids = self.kv_override_per_sample(policy, cache_ratio, prompt, gen, n_layers, heads=heads)
        if sample is None:
            return per_sample.mean(axis=0)
        if str(sample) not in ids:
            raise ValueError(f"sample {sample!r} not in trace {self.path} (have {', '.join(ids[:5])}...)")
        return per_sample[ids.index(str(sample))]

    def kv_override_per_sample(self, policy: str, cache_ratio: float, prompt: int, gen: int, n_layers: int,
                               heads: str = "mean") -> tuple[np.ndarray, list[str]]:
        """Like kv_override, one array per captured sample: shape (n_samples, gen + 1, n_layers).

        The DES draws requests from these to keep the heterogeneity across requests.
        """
        if prompt < 1 or gen < 0 or n_layers < 1:
            raise ValueError(f"need prompt >= 1, gen >= 0, n_layers >= 1 (got {prompt}, {gen}, {n_layers})")
        if heads not in ("mean", "max"):
            raise ValueError(f"heads must be 'mean' or 'max', not {heads!r}")
        series = self._series(policy, cache_ratio, heads)
        budget = max(1, int(np.floor(series.ratio * prompt + 1e-9)))
        out = _map_onto_target(series, prompt, gen, n_layers, budget)
        return out, list(series.samples)

    def _series(self, policy: str, cache_ratio: float, heads: str) -> _Series:
        """Per sample, step row and trace layer: the fractions the mapping needs (cached)."""
        ratio = self._resolve_ratio(policy, cache_ratio)
        key = (policy, ratio, heads)
        if key not in self._series_cache:
            self._series_cache[key] = _Series.build(self._rows(policy, ratio), ratio, heads, self.path)
        return self._series_cache[key]

    # ---- helpers -------------------------------------------------------------------------------
    def _check_policy(self, policy: str) -> None:
        if policy not in self.policies:
            raise ValueError(f"policy {policy!r} not in trace {self.path} (have {', '.join(self.policies)})")

    def _resolve_ratio(self, policy: str, cache_ratio: float) -> float:
        ratios = self.cache_ratios(policy)
        if policy == "full" and len(ratios) == 1:
            return ratios[0]  # the full cache keeps everything whatever ratio is asked for
        for r in ratios:
            if abs(r - cache_ratio) < 1e-4:
                return r
        raise ValueError(f"cache ratio {cache_ratio:g} not captured for {policy} in {self.path} "
                         f"(have {', '.join(f'{r:g}' for r in ratios)})")

    def _rows(self, policy: str, cache_ratio: float) -> pd.DataFrame:
        ratio = self._resolve_ratio(policy, cache_ratio)
        return self.kv.iloc[self._groups[(policy, round(ratio, 4))]]


def _interp_axis(values: np.ndarray, n_out: int, axis: int) -> np.ndarray:
    """Resample one axis to n_out points by relative position (first to first, last to last), linearly."""
    values = np.moveaxis(values, axis, 0)
    src = values.shape[0]
    if src == 1:
        out = np.repeat(values, n_out, axis=0)
    else:
        x = np.linspace(0.0, src - 1, n_out)
        lo = np.floor(x).astype(int)
        hi = np.minimum(lo + 1, src - 1)
        w = (x - lo).reshape((-1,) + (1,) * (values.ndim - 1))
        out = values[lo] * (1 - w) + values[hi] * w
    return np.moveaxis(out, 0, axis)


@dataclass
class _Series:
    """Dense per-sample arrays of one policy x ratio, shape (samples, step rows, trace layers)."""
    samples: list
    ratio: float
    prompt_frac: np.ndarray  # kept prompt tokens / n
    gen_frac: np.ndarray  # kept generated tokens / generated tokens existing (1 when none exist yet)
    evicting: np.ndarray  # bool: the head holds fewer tokens than exist
    budget_factor: np.ndarray  # kv_len / the nominal budget max(1, floor(ratio * n))

    @classmethod
    def build(cls, rows: pd.DataFrame, ratio: float, heads: str, path) -> _Series:
        samples = list(dict.fromkeys(rows["sample"]))
        steps = np.sort(rows["step"].unique())
        layers = np.sort(rows["layer"].unique())
        sample_index = {s: i for i, s in enumerate(samples)}
        shape = (len(samples), len(steps), len(layers))
        s_idx = rows["sample"].map(sample_index).to_numpy()
        t_idx = np.searchsorted(steps, rows["step"].to_numpy())
        l_idx = np.searchsorted(layers, rows["layer"].to_numpy())
        flat = np.ravel_multi_index((s_idx, t_idx, l_idx), shape)
        kv_len = rows["kv_len"].to_numpy(float)
        kept_prompt = rows["kept_prompt"].to_numpy(float)
        counts = np.bincount(flat, minlength=np.prod(shape))
        if (counts == 0).any():
            raise TraceError(f"{path / schema.KV}: incomplete (some sample x step x layer has no rows)")
        if heads == "mean":
            held = np.bincount(flat, kv_len, minlength=counts.size) / counts
            prompt_held = np.bincount(flat, kept_prompt, minlength=counts.size) / counts
        else:  # the fullest head of each layer, with that head's own prompt/generated split
            order = np.lexsort((kv_len, flat))  # by cell, then by length: the last of each cell is the max
            last = np.r_[flat[order][1:] != flat[order][:-1], True]
            held = np.empty(counts.size)
            prompt_held = np.empty(counts.size)
            held[flat[order][last]] = kv_len[order][last]
            prompt_held[flat[order][last]] = kept_prompt[order][last]
        held, prompt_held = held.reshape(shape), prompt_held.reshape(shape)
        n = rows.groupby("sample")["prompt_len"].first().reindex(samples).to_numpy(float)[:, None, None]
        generated = (steps + 1).astype(float)[None, :, None]  # generated tokens existing after step s
        with np.errstate(invalid="ignore", divide="ignore"):
            gen_frac = np.where(generated > 0, (held - prompt_held) / generated, 1.0)
        budget = np.maximum(1.0, np.floor(ratio * n + 1e-9))
        return cls(samples, ratio, prompt_held / n, gen_frac, held < n + generated - 0.5, held / budget)


def _map_onto_target(series: _Series, prompt: int, gen: int, n_layers: int, budget: int) -> np.ndarray:
    """Evicting rows hold the target's own budget times the trace's deviation from its budget (1.0 for
    the exact-budget policies); growing rows keep the trace's kept prompt and generated fractions."""
    rows = gen + 1

    def resample(values):  # (samples, steps, layers) -> (samples, rows, n_layers), by relative position
        return _interp_axis(_interp_axis(values, rows, axis=1), n_layers, axis=2)

    generated = np.arange(rows, dtype=float)[None, :, None]  # row r reads the cache after r generated tokens
    growing = resample(series.prompt_frac) * prompt + resample(series.gen_frac) * generated
    evicting = resample(series.evicting.astype(float)) >= 0.5
    held = np.where(evicting, resample(series.budget_factor) * budget, growing)
    return np.clip(held, 1.0, prompt + generated)
