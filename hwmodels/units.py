"""Units accepted in hardware files, and conversion to SI base values.

Every number in a hardware file is `{value: X, unit: U, source: S}`. Each field has one
*kind* of quantity (a size, a bandwidth, a rate of operations, a time, an operation count
or a plain fraction); a unit of another kind is an error, so a bandwidth written in `GB`
or in `TFLOP/s` is caught at load time instead of silently producing nonsense.

Decimal prefixes are powers of 1000 (GB = 1e9 bytes, as datasheets use them); binary
prefixes (KiB, MiB, GiB, TiB) are powers of 1024.
"""
from __future__ import annotations

DECIMAL = {"": 1.0, "K": 1e3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
BINARY = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40}


def _bytes_units() -> dict[str, float]:
    units = {f"{p}B": f for p, f in DECIMAL.items() if p != "k"}
    units.update({f"{p}B": f for p, f in BINARY.items()})
    units["bytes"] = 1.0
    return units


def _rate_units(names: tuple[str, ...]) -> dict[str, float]:
    return {f"{p}{n}": f for p, f in DECIMAL.items() if p != "k" for n in names}


BYTES = _bytes_units()
BANDWIDTH = {f"{u}/s": f for u, f in BYTES.items() if u != "bytes"}
# Tensor-core throughput: FLOP/s for floating point, OP/s (TOPS) for integer formats.
# Both mean "multiply-adds counted as two operations per second".
OPS_RATE = _rate_units(("FLOP/s", "FLOPS", "OP/s", "OPS"))
OPS = _rate_units(("FLOP", "OP"))
TIME = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
FRACTION = {"1": 1.0, "fraction": 1.0}

KINDS: dict[str, dict[str, float]] = {
    "size": BYTES,
    "bandwidth": BANDWIDTH,
    "ops_rate": OPS_RATE,
    "ops": OPS,
    "time": TIME,
    "fraction": FRACTION,
    "rows": {"rows": 1.0},
    "head_dim": {"head_dim": 1.0},
}
KIND_WORDS = {
    "size": "a size in bytes",
    "bandwidth": "a bandwidth",
    "ops_rate": "a rate of operations",
    "ops": "an operation count",
    "time": "a time",
    "fraction": "a fraction",
    "rows": "a count of token rows",
    "head_dim": "an attention head width in elements",
}
# Units shown in error messages (the full tables are long).
SHOWN = {
    "size": "B, KB, MB, GB, TB, KiB, MiB, GiB, TiB",
    "bandwidth": "B/s, MB/s, GB/s, TB/s, MiB/s, GiB/s, TiB/s",
    "ops_rate": "FLOP/s, GFLOP/s, TFLOP/s, PFLOP/s (or TFLOPS, TOPS, OP/s)",
    "ops": "FLOP, MFLOP, GFLOP, TFLOP (or OP)",
    "time": "s, ms, us, ns",
    "fraction": "none (a plain number)",
    "rows": "rows",
    "head_dim": "head_dim",
}


class UnitError(ValueError):
    """A unit that is unknown or of the wrong kind for its field (message without location)."""


def kind_of(unit: str) -> str | None:
    for kind, table in KINDS.items():
        if unit in table:
            return kind
    return None


def to_base(value: float, unit: str | None, kind: str) -> float:
    """Convert `value` in `unit` to the base unit of `kind` (bytes, bytes/s, op/s, op, s, 1)."""
    if unit is None:
        if kind == "fraction":
            return float(value)
        raise UnitError(f"missing unit; expected {KIND_WORDS[kind]} ({SHOWN[kind]})")
    unit = str(unit).strip()
    table = KINDS[kind]
    if unit in table:
        return float(value) * table[unit]
    other = kind_of(unit)
    if other is not None:
        raise UnitError(f"unit {unit!r} is {KIND_WORDS[other]}, not {KIND_WORDS[kind]}; "
                        f"expected one of {SHOWN[kind]}")
    raise UnitError(f"unknown unit {unit!r}; expected {KIND_WORDS[kind]} ({SHOWN[kind]})")


def format_quantity(value: float, kind: str) -> str:
    """Readable rendering of a base value, e.g. 4.8e12 bandwidth -> '4.80 TB/s'."""
    if kind == "fraction":
        return f"{value:.3g}"
    if kind == "time":
        for unit, factor in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
            if abs(value) >= factor:
                return f"{value / factor:.3g} {unit}"
        return f"{value / 1e-9:.3g} ns"
    if kind == "capacity":   # a memory capacity: in GiB when it is a whole number of them (binary DRAM)
        gib = value / 2**30
        if gib >= 1 and abs(gib - round(gib)) < 1e-9 * gib:
            return f"{round(gib)} GiB"
        kind = "size"
    suffix = {"size": "B", "bandwidth": "B/s", "ops_rate": "FLOP/s", "ops": "FLOP"}[kind]
    # Rates stop at T (datasheets write 1,979 TFLOP/s, not 1.979 PFLOP/s).
    prefixes = ("T", "G", "M", "K") if kind in ("bandwidth", "ops_rate") else ("P", "T", "G", "M", "K")
    for prefix in prefixes:
        if abs(value) >= DECIMAL[prefix]:
            return f"{value / DECIMAL[prefix]:.4g} {prefix}{suffix}"
    return f"{value:.4g} {suffix}"
