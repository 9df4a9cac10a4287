"""Hardware file schema: YAML text -> validated values in base units, or one clear error.

File layout (schema_version 1). Every number is `{value, unit, source}`; see units.py for
the units each field accepts and devices/h200-sxm.yaml for a complete example.

    schema_version: 1
    name: h200-sxm
    description: NVIDIA H200 SXM, 141 GB HBM3e
    memory_capacity:  {value: 141, unit: GB, source: ...}
    memory_bandwidth: {value: 4.8, unit: TB/s, source: ...}
    peak_flops:              # dense (no 2:4 sparsity), per dtype name of hwmodels.dtypes
      bf16: {value: 989.4, unit: TFLOP/s, source: ...}
    bw_efficiency:           # fraction of memory_bandwidth vs transfer size
      form: saturating       # max_fraction * s / (s + half_size)
      max_fraction: {value: 0.8, source: ...}
      half_size: {value: 2.4, unit: MB, source: ...}
    compute_efficiency:      # fraction of peak FLOP/s vs kernel FLOPs
      form: table            # points interpolated in log(size)
      size_unit: GFLOP
      points: [[0.1, 0.2], [10, 0.7], [1000, 0.8]]
      source: ...
      reference_dtype: bf16  # optional: the dtype whose peak the sizes are measured/derived at;
                             # a kernel of another dtype is looked up at the same time-at-peak,
                             # i.e. at FLOPs x peak(reference_dtype) / peak(its dtype)
    gemm_rows_efficiency:    # optional: fraction of peak FLOP/s of a weight GEMM vs its token rows
      form: table            # (skinny GEMMs: F.linear of a few rows against a model-sized weight)
      size_unit: rows
      points: [[1, 0.05], [8, 0.15], [64, 0.6]]
      source: ...
    gemm_rows_in_out_efficiency:  # optional: the same for weights stored [in, out] (x @ W: Conv1D)
      form: table
      size_unit: rows
      points: [[1, 0.05], [8, 0.2], [64, 0.6]]
      source: ...
    attn_scores_efficiency:  # optional: fraction of the streaming (GEMV) rate that eager attention's
      form: table            # q @ K^T over the KV cache reaches, vs head width (any shape allowed)
      size_unit: head_dim
      points: [[64, 0.65], [128, 1.0]]
      source: ...
    attn_values_efficiency:  # optional: the same for p @ V
    sdpa_decode_efficiency:  # optional: fraction of the fp32 peak SDPA's decode kernel reaches per
                             # (query head, key) with K/V in cache, vs head width (any shape allowed)
      form: table
      size_unit: head_dim
      points: [[64, 0.9], [128, 1.0]]
      source: ...
    fresh_alloc_efficiency:  # optional: fraction of the copy rate into an existing buffer that a copy
      form: table            # into a newly allocated tensor of this size reaches (a CPU allocator
      size_unit: B           # maps fresh pages above its mmap threshold: page faults + zeroing)
      points: [[16777216, 1.0], [35651584, 0.25]]
      source: ...
    launch_overhead: {value: 4, unit: us, source: ...}   # per kernel
    host_overhead:   {value: 1, unit: ms, source: ...}   # per step
    eager_call_overhead: {value: 4, unit: us, source: ...}   # optional: per top-level call of eager
                             # model code (hwmodels.calibrate's eager_call benchmark); eager profiles
                             # charge it instead of launch_overhead
    eager_weight_switch_overhead: {value: 90, unit: us, source: ...}   # optional: what the eager calls
                             # around one streamed weight GEMV lose (caches refilled after the stream;
                             # the eager_stream benchmark); eager profiles charge it per weight-GEMM launch
    notes: optional free text
    calibration: optional provenance block written by hwmodels.calibrate (not used by the model)
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import yaml

from .curves import SaturatingCurve, TableCurve, check_table
from .device import CURVE_TABLES, NEUTRAL, CalibratedTables
from .dtypes import DTYPES
from .errors import HardwareFileError
from .units import UnitError, to_base

SCHEMA_VERSION = 1
REQUIRED = ("schema_version", "name", "description", "memory_capacity", "memory_bandwidth",
            "peak_flops", "bw_efficiency", "compute_efficiency", "launch_overhead",
            "host_overhead")
ATTN_TABLES = ("attn_scores_efficiency", "attn_values_efficiency")
SDPA_TABLE = "sdpa_decode_efficiency"
FRESH_TABLE = "fresh_alloc_efficiency"
# tables of a factor, not a size curve that saturates: any shape is valid
ANY_SHAPE_TABLES = (*ATTN_TABLES, SDPA_TABLE, FRESH_TABLE)
ROWS_TABLES = ("gemm_rows_efficiency", "gemm_rows_in_out_efficiency")
OPTIONAL = ("notes", "calibration", *ROWS_TABLES, *ATTN_TABLES, SDPA_TABLE, FRESH_TABLE, "eager_call_overhead",
            "eager_weight_switch_overhead")
QUANTITY_KEYS = ("value", "unit", "source")
CURVE_SIZE_KIND = {"bw_efficiency": "size", "compute_efficiency": "ops", **{key: "rows" for key in ROWS_TABLES},
                   **{key: "head_dim" for key in (*ATTN_TABLES, SDPA_TABLE)}, FRESH_TABLE: "size"}
# Provenance and raw medians written by hwmodels.calibrate; kept for re-fitting, not read
# by the model.
CALIBRATION_KEYS = ("tool", "mode", "device", "host", "date", "wall_time_s", "env", "versions",
                    "repeats", "statistic", "load_average", "last_level_cache", "pool_bytes",
                    "fit", "series", "merged_from")


@dataclass(frozen=True)
class ParsedFile:
    """Validated content of one hardware file, in base units (bytes, bytes/s, FLOP/s, s)."""
    name: str
    description: str
    memory_bytes: float
    memory_bw: float
    flops: dict
    bw_curve: object
    compute_curve: object
    launch_overhead_s: float
    host_overhead_s: float
    sources: dict
    notes: str | None
    calibration: dict | None
    compute_reference_dtype: str | None = None
    tables: CalibratedTables = NEUTRAL   # the optional calibrated tables (hwmodels.device)


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (plain YAML silently keeps the last one)."""


def _mapping_without_duplicates(loader, node, deep=False):
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
                                 _mapping_without_duplicates)


def load_yaml(text: str, path) -> dict:
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise HardwareFileError(path, None, f"not valid YAML{where}: {problem}") from None
    if not isinstance(data, dict):
        raise HardwareFileError(path, None, "expected a YAML mapping of fields at the top level, "
                                f"got {type(data).__name__}")
    return data


class _Reader:
    """Field accessors that turn every problem into a HardwareFileError naming the field."""

    def __init__(self, path):
        self.path = path
        self.sources: dict[str, str] = {}

    def fail(self, field, problem):
        raise HardwareFileError(self.path, field, problem)

    def keys(self, mapping, field, required, optional=()):
        if not isinstance(mapping, dict):
            self.fail(field, f"expected a mapping, got {_describe(mapping)}")
        prefix = f"{field}." if field else ""
        for key in mapping:
            if key not in required and key not in optional:
                allowed = ", ".join((*required, *optional))
                self.fail(f"{prefix}{key}", f"unknown field; allowed here: {allowed}")
        for key in required:
            if key not in mapping:
                self.fail(f"{prefix}{key}", "missing required field")

    def text(self, mapping, key, field):
        value = mapping[key]
        if not isinstance(value, str) or not value.strip():
            self.fail(field, f"expected non-empty text, got {_describe(value)}")
        return value.strip()

    def number(self, value, field):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(field, f"expected a number, got {_describe(value)}")
        if not math.isfinite(value):
            self.fail(field, f"expected a finite number, got {value}")
        if value <= 0:
            self.fail(field, f"must be positive, got {value}")
        return float(value)

    def quantity(self, mapping, key, field, kind):
        """A `{value, unit, source}` entry -> value in base units; records the source."""
        entry = mapping[key]
        optional_unit = kind == "fraction"
        self.keys(entry, field, ("value", "source") if optional_unit else QUANTITY_KEYS,
                  ("unit",) if optional_unit else ())
        value = self.number(entry["value"], f"{field}.value")
        source = self.text(entry, "source", f"{field}.source")
        try:
            base = to_base(value, entry.get("unit"), kind)
        except UnitError as exc:
            self.fail(f"{field}.unit", str(exc))
        if kind == "fraction" and base > 1.0:
            self.fail(f"{field}.value", f"a fraction must be in (0, 1], got {value}")
        self.sources[field] = source
        return base

    def curve(self, mapping, key):
        spec = mapping[key]
        size_kind = CURVE_SIZE_KIND[key]
        if not isinstance(spec, dict):
            self.fail(key, f"expected a mapping with a 'form', got {_describe(spec)}")
        if "form" not in spec:
            self.fail(f"{key}.form", "missing required field (saturating or table)")
        form = spec["form"]
        extra = ("reference_dtype",) if key == "compute_efficiency" else ()
        if form == "saturating":
            self.keys(spec, key, ("form", "max_fraction", "half_size"), extra)
            max_fraction = self.quantity(spec, "max_fraction", f"{key}.max_fraction", "fraction")
            half_size = self.quantity(spec, "half_size", f"{key}.half_size", size_kind)
            return SaturatingCurve(max_fraction, half_size)
        if form == "table":
            self.keys(spec, key, ("form", "size_unit", "points", "source"), extra)
            try:
                scale = to_base(1.0, spec["size_unit"], size_kind)
            except UnitError as exc:
                self.fail(f"{key}.size_unit", str(exc))
            points = spec["points"]
            if not isinstance(points, list) or not points:
                self.fail(f"{key}.points", f"expected a list of [size, fraction] pairs, "
                          f"got {_describe(points)}")
            sizes, fractions = [], []
            for i, point in enumerate(points):
                if not isinstance(point, list) or len(point) != 2:
                    self.fail(f"{key}.points[{i}]", f"expected [size, fraction], got {_describe(point)}")
                sizes.append(self.number(point[0], f"{key}.points[{i}]") * scale)
                fractions.append(self.number(point[1], f"{key}.points[{i}]"))
            try:
                check_table(sizes, fractions, monotone=key not in ANY_SHAPE_TABLES)
            except ValueError as exc:
                self.fail(f"{key}.points", str(exc))
            self.sources[key] = self.text(spec, "source", f"{key}.source")
            return TableCurve(tuple(sizes), tuple(fractions), monotone=key not in ANY_SHAPE_TABLES)
        self.fail(f"{key}.form", f"unknown curve form {form!r}; expected saturating or table")


def parse(data: dict, path) -> ParsedFile:
    r = _Reader(path)
    r.keys(data, "", REQUIRED, OPTIONAL)
    if data["schema_version"] != SCHEMA_VERSION:
        r.fail("schema_version", f"unsupported version {data['schema_version']!r}; "
               f"this kvsim reads version {SCHEMA_VERSION}")
    name = r.text(data, "name", "name")
    if any(c.isspace() or c in "/\\" for c in name):
        r.fail("name", f"must be a single word without slashes, got {name!r}")
    description = r.text(data, "description", "description")
    memory_bytes = r.quantity(data, "memory_capacity", "memory_capacity", "size")
    memory_bw = r.quantity(data, "memory_bandwidth", "memory_bandwidth", "bandwidth")

    peaks = data["peak_flops"]
    if not isinstance(peaks, dict) or not peaks:
        r.fail("peak_flops", f"expected a mapping of dtype -> entry, got {_describe(peaks)}")
    flops = {}
    for dtype in peaks:
        if dtype not in DTYPES:
            r.fail(f"peak_flops.{dtype}", f"unknown dtype; expected one of {', '.join(DTYPES)}")
        flops[dtype] = r.quantity(peaks, dtype, f"peak_flops.{dtype}", "ops_rate")

    bw_curve = r.curve(data, "bw_efficiency")
    compute_curve = r.curve(data, "compute_efficiency")
    reference = None
    spec = data["compute_efficiency"]
    if "reference_dtype" in spec:
        reference = spec["reference_dtype"]
        if reference not in flops:
            r.fail("compute_efficiency.reference_dtype",
                   f"must name a dtype listed under peak_flops ({', '.join(flops)}), got {_describe(reference)}")
    curves = {attr: r.curve(data, key) for key, attr in CURVE_TABLES if key in data}
    launch = r.quantity(data, "launch_overhead", "launch_overhead", "time")
    host = r.quantity(data, "host_overhead", "host_overhead", "time")
    eager_call = (r.quantity(data, "eager_call_overhead", "eager_call_overhead", "time")
                  if "eager_call_overhead" in data else None)
    switch = (r.quantity(data, "eager_weight_switch_overhead", "eager_weight_switch_overhead", "time")
              if "eager_weight_switch_overhead" in data else None)

    notes = r.text(data, "notes", "notes") if "notes" in data else None
    calibration = data.get("calibration")
    if calibration is not None:
        r.keys(calibration, "calibration", (), CALIBRATION_KEYS)
    given = dict(curves, eager_call_overhead_s=eager_call, eager_weight_switch_s=switch)
    tables = CalibratedTables(**given) if any(v is not None for v in given.values()) else NEUTRAL
    return ParsedFile(name, description, memory_bytes, memory_bw, flops, bw_curve, compute_curve,
                      launch, host, r.sources, notes, calibration, reference, tables)


def _describe(value) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, (dict, list)):
        return f"a {type(value).__name__}"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
