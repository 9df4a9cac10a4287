"""traces: real runs on disk. The reader side (load, Trace, TraceError, schema, catalog, timing_format,
datasets, assets) is torch-free.

    import traces
    trace = traces.load("traces/data/smollm2-135m")
    trace.kv_override("keyformer", 0.5, prompt=2048, gen=512, n_layers=32)   # (513, 32) kept tokens per KV head
    traces.catalog().timing                                                  # the bundled timing folders

Capture with `python -m traces.capture`, score with `python -m traces.quality`; docs/traces.md has the format.
"""
from traces.catalog import Catalog, catalog
from traces.reader import Trace, TraceError, load
from traces.schema import SCHEMA_VERSION

__all__ = ["SCHEMA_VERSION", "Catalog", "Trace", "TraceError", "bundled", "catalog", "load"]


def bundled(name: str | None = None):
    """Path of a bundled trace folder under traces/data/ (or the list of their names when name is None)."""
    cat = catalog()
    if name is None:
        return [cat.name(p) for p in cat.traces]
    return cat.trace(name)
