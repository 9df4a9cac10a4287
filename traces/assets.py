"""Where the local real assets (weights, corpora) live. Never a path of one machine.

KVSIM_ASSETS overrides; the default is `../shared/assets` next to the repository root.
"""
from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = Path(__file__).resolve().parent / "data"   # the bundled data (traces.catalog() lists it)


def assets_dir() -> Path:
    env = os.environ.get("KVSIM_ASSETS")
    return Path(env).expanduser().resolve() if env else (REPO_ROOT.parent / "shared" / "assets").resolve()


def asset(*parts: str) -> Path:
    """Path of one asset; FileNotFoundError with a hint when it is absent."""
    path = assets_dir().joinpath(*parts)
    if not path.exists():
        raise FileNotFoundError(
            f"asset {'/'.join(parts)} not found under {assets_dir()} (set KVSIM_ASSETS to the assets folder)")
    return path


def have_assets(*parts: str) -> bool:
    return assets_dir().joinpath(*parts).exists()
