"""traces: real runs on disk. The reader side (load, Trace, TraceError, schema, datasets, assets) is torch-free.

    import traces
    trace = traces.load("traces/data/smollm2-135m")
    trace.kv_override("keyformer", 0.5, prompt=2048, gen=512, n_layers=32)   # (513, 32) kept tokens per KV head

Capture with `python -m traces.capture`, score with `python -m traces.quality`; docs/traces.md has the format.
"""
from traces.reader import Trace, TraceError, load
from traces.schema import SCHEMA_VERSION

__all__ = ["SCHEMA_VERSION", "Trace", "TraceError", "bundled", "load"]


def bundled(name: str | None = None):
    """Path of a bundled trace folder under traces/data/ (or the list of them when name is None)."""
    import json
    from pathlib import Path

    from traces.schema import KIND

    def is_trace(manifest: Path) -> bool:  # traces/data also holds other kinds (timing runs)
        try:
            return json.loads(manifest.read_text()).get("kind") == KIND
        except (OSError, ValueError):
            return False

    root = Path(__file__).parent / "data"
    folders = sorted(p.parent.relative_to(root).as_posix() for p in root.glob("**/manifest.json") if is_trace(p))
    if name is None:
        return folders
    if name not in folders:
        raise FileNotFoundError(f"no bundled trace {name!r} (have {', '.join(folders) or 'none'})")
    return root / name
