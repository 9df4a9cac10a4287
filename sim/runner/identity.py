"""What identifies a point's result: the code version, stable hashes and 128-bit point keys."""
from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

REPO_ROOT = Path(__file__).resolve().parents[2]
# The packages whose source decides a simulated result; editing any of them starts a fresh cache.
CODE_PACKAGES = ("sim", "hwmodels", "traces")


@lru_cache(maxsize=None)
def code_version(packages: tuple[str, ...] = CODE_PACKAGES) -> str:
    """Hash of every ``.py`` file of the simulator packages (paths and contents), plus the version.

    Conservative on purpose: any source edit invalidates cached results, since a cache that silently
    serves numbers from older code is worse than recomputing."""
    digest = hashlib.sha256()
    try:
        from importlib.metadata import version
        digest.update(version("kvsim").encode())
    except Exception:  # not installed (running from a checkout): the sources alone decide
        pass
    for package in packages:
        root = REPO_ROOT / package
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(REPO_ROOT).as_posix()
            if "/data/" in rel or "__pycache__" in rel:
                continue
            digest.update(rel.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def stable_hash(obj) -> str:
    """Hash of a JSON-able object, independent of dict order."""
    text = json.dumps(obj, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def function_name(fn: Callable) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _canonical_column(values: pd.Series) -> pd.Series:
    """Numbers as float64 rounded to 12 significant digits, everything else as text.

    So 1 and 1.0, or 0.1+0.2 and 0.3, name the same point: a grid rebuilt from a YAML file and one
    built with numpy then share cache entries."""
    if pd.api.types.is_bool_dtype(values) or pd.api.types.is_numeric_dtype(values):
        x = values.to_numpy(dtype=np.float64, na_value=np.nan)
        finite = np.isfinite(x) & (x != 0)
        out = x.copy()
        magnitude = np.floor(np.log10(np.abs(x[finite])))
        scale = 10.0 ** (11 - magnitude)
        out[finite] = np.round(x[finite] * scale) / scale
        out[x == 0] = 0.0  # -0.0 and 0.0 hash differently otherwise
        return pd.Series(out, index=values.index)
    return values.astype(str)


def point_keys(points: pd.DataFrame, key_columns: Sequence[str], salt: str) -> tuple[np.ndarray, np.ndarray]:
    """Two independent 64-bit hashes per row (a 128-bit key) of ``key_columns`` and ``salt``.

    Vectorised (pandas' row hashing), ~0.1 s per million rows, so keys are cheap even at 10^7 points."""
    missing = [c for c in key_columns if c not in points.columns]
    if missing:
        raise ValueError(f"key columns {missing} are not columns of the design points")
    columns = sorted(key_columns)
    frame = pd.DataFrame({c: _canonical_column(points[c]) for c in columns}, index=points.index)
    seed = hashlib.sha256((salt + "\0" + "\0".join(columns)).encode()).hexdigest()
    hi = pd.util.hash_pandas_object(frame, index=False, hash_key=seed[:16]).to_numpy(np.uint64)
    lo = pd.util.hash_pandas_object(frame, index=False, hash_key=seed[16:32]).to_numpy(np.uint64)
    return hi, lo
