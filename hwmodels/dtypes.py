"""Data-type names used everywhere (CLI flags, hardware files, model specs, tables): kvcommon.dtypes, the
bottom layer, holds them (a design point checks its dtype fields there); re-exported here for hwmodels'
users."""
from kvcommon.dtypes import ALIASES, BYTES_PER_ELEMENT, DTYPES, canonical_dtype, dtype_bytes

__all__ = ["ALIASES", "BYTES_PER_ELEMENT", "DTYPES", "canonical_dtype", "dtype_bytes"]
