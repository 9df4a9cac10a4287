"""Data-type names used everywhere (CLI flags, hardware files, model specs, tables).

One name per storage format; the byte width is what the simulator charges for moving
one element. int4 packs two elements per byte. (The bottom of the project, so that a design point can
check its dtype fields; `hwmodels.dtypes` re-exports these names.)
"""

BYTES_PER_ELEMENT = {
    "fp32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "int4": 0.5,
}
DTYPES = tuple(BYTES_PER_ELEMENT)

# Hugging Face / torch spellings accepted on input, mapped to the names above.
ALIASES = {
    "float32": "fp32", "float": "fp32", "torch.float32": "fp32",
    "bfloat16": "bf16", "torch.bfloat16": "bf16",
    "float16": "fp16", "half": "fp16", "torch.float16": "fp16",
    "float8": "fp8", "float8_e4m3fn": "fp8", "e4m3": "fp8",
}


def canonical_dtype(name: str) -> str:
    """Return the canonical dtype name or raise ValueError naming the valid ones."""
    key = dtype_name(name)
    if key not in BYTES_PER_ELEMENT:
        raise ValueError(f"unknown dtype {name!r}; expected one of {', '.join(DTYPES)}")
    return key


def dtype_name(name: str) -> str:
    """The canonical spelling of a name (aliases mapped, lower case) without checking it: a field's
    `convert`, its choices (DTYPES) do the check."""
    key = str(name).strip().lower()
    return ALIASES.get(key, key)


def dtype_bytes(name: str) -> float:
    return BYTES_PER_ELEMENT[canonical_dtype(name)]
