"""`python -m hwmodels list` / `python -m hwmodels show NAME|FILE [--json]`."""
from __future__ import annotations

import json
import sys

from kvcommon.cli import OneLineParser, fail

from .device import CURVE_TABLES
from .dtypes import DTYPES
from .errors import HardwareFileError
from .registry import list_devices, load_device
from .schema import CURVE_SIZE_KIND
from .units import format_quantity

# Sizes at which `show` samples the efficiency curves (bytes, FLOPs).
SAMPLE_BYTES = (1e5, 1e6, 1e7, 1e8, 1e9)
SAMPLE_FLOPS = (1e7, 1e9, 1e11, 1e12)


# Optional tables (file key, CalibratedTables attribute, unit of their sizes), shown point by point when present.
TABLES = tuple((key, attr, "bytes" if CURVE_SIZE_KIND[key] == "size" else CURVE_SIZE_KIND[key])
               for key, attr in CURVE_TABLES)
LONG_FIELDS = ("bw_efficiency", "compute_efficiency", *(key for key, _, _ in TABLES))


def show_rows(device) -> list[tuple[str, str, str]]:
    """(field, value, source) rows describing a device."""
    src = device.sources
    rows = [
        ("memory_capacity", format_quantity(device.memory_bytes, "capacity"), src["memory_capacity"]),
        ("memory_bandwidth", format_quantity(device.memory_bw, "bandwidth"), src["memory_bandwidth"]),
    ]
    for dtype in DTYPES:
        try:
            used = device.flops_dtype(dtype)
        except ValueError:
            continue
        value = format_quantity(device.flops[used], "ops_rate")
        if dtype.startswith("int"):  # integer formats: operations, not floating-point ones
            value = value.replace("FLOP/s", "OP/s")
        if used == dtype:
            rows.append((f"peak_flops.{dtype}", value, src[f"peak_flops.{dtype}"]))
        else:
            rows.append((f"peak_flops.{dtype}", value, f"fallback: not in the file, uses the {used} rate"))
    for key, samples, kind in (("bw_efficiency", SAMPLE_BYTES, "size"),
                               ("compute_efficiency", SAMPLE_FLOPS, "ops")):
        curve = getattr(device, "bw_curve" if key == "bw_efficiency" else "compute_curve")
        fractions = curve(list(samples))
        value = ", ".join(f"{format_quantity(s, kind)}: {f:.3g}" for s, f in zip(samples, fractions))
        sources = [f"{field.split('.', 1)[1]}: {text}" if "." in field else text
                   for field, text in src.items() if field.split(".")[0] == key]
        rows.append((key, value, " | ".join(sources)))
    for key, attr, unit in TABLES:
        curve = getattr(device.tables, attr)
        if curve is not None:
            points = ", ".join(f"{format_quantity(s, 'size') if unit == 'bytes' else f'{s:g} {unit}'}: {f:.3g}"
                               for s, f in zip(curve.sizes, curve.fractions))
            rows.append((key, points, src.get(key, "")))
    rows.append(("launch_overhead", format_quantity(device.launch_overhead_s, "time"), src["launch_overhead"]))
    rows.append(("host_overhead", format_quantity(device.host_overhead_s, "time"), src["host_overhead"]))
    if device.tables.eager_call_overhead_s is not None:
        rows.append(("eager_call_overhead", format_quantity(device.tables.eager_call_overhead_s, "time"),
                     src["eager_call_overhead"]))
    if device.tables.eager_weight_switch_s is not None:
        rows.append(("eager_weight_switch_overhead", format_quantity(device.tables.eager_weight_switch_s, "time"),
                     src["eager_weight_switch_overhead"]))
    return rows


def print_show(device) -> None:
    print(f"{device.name}: {device.description}")
    print(f"file: {device.source_path} (content hash {device.content_hash})")
    if device.notes:
        print(f"notes: {device.notes}")
    print()
    rows = [("field", "value", "source")] + show_rows(device)
    width_field = max(len(r[0]) for r in rows)
    width_value = max(len(r[1]) for r in rows if r[0] not in LONG_FIELDS)
    for field, value, source in rows:
        if field in LONG_FIELDS:
            # The sampled curve is too long for the value column: its own line, source below.
            print(f"{field:<{width_field}}  {value}")
            print(f"{'':<{width_field}}  {'':<{width_value}}  {source}")
        else:
            print(f"{field:<{width_field}}  {value:<{width_value}}  {source}")


def list_rows() -> list[tuple[str, ...]]:
    """One row per shipped device: name, memory, peak bandwidth, dense FLOP/s in bf16 and fp8, kind
    (datasheet or calibrated). A broken file shows as such instead of hiding the others."""
    rows = [("name", "memory", "bandwidth", "bf16 dense", "fp8 dense", "from")]
    for name in list_devices():
        try:
            device = load_device(name)
        except HardwareFileError as exc:
            rows.append((name, "-", "-", "-", "-", f"unreadable: {exc}"))
            continue
        peaks = []
        for dtype in ("bf16", "fp8"):
            used = device.flops_dtype(dtype)
            text = format_quantity(device.flops[used], "ops_rate")
            peaks.append(text if used == dtype else f"{text} ({used})")
        rows.append((name, format_quantity(device.memory_bytes, "capacity"), format_quantity(device.memory_bw, "bandwidth"),
                     *peaks, "calibrated" if device.calibration else "datasheet"))
    return rows


def print_list() -> None:
    rows = list_rows()
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(f"{cell:<{w}}" for cell, w in zip(row, widths)) + "  " + row[-1])


def main(argv=None) -> int:
    parser = OneLineParser(prog="python -m hwmodels", description="Hardware files of kvsim.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    listing = sub.add_parser("list", help="print the shipped devices: memory, peak bandwidth, dense FLOP/s "
                             "(bf16, fp8; a fallback dtype in parentheses)")
    listing.add_argument("--names", action="store_true", help="names only, one per line (for scripts)")
    show = sub.add_parser("show", help="print one device as a table with sources")
    show.add_argument("device", help="a shipped device name or a path to a hardware YAML file")
    show.add_argument("--json", action="store_true", help="print the device as one JSON object")
    args = parser.parse_args(argv)
    try:
        if args.command == "list":
            if args.names:
                print("\n".join(list_devices()))
            else:
                print_list()
            return 0
        device = load_device(args.device)
        if args.json:
            print(json.dumps(device.to_dict(), indent=1))
        else:
            print_show(device)
        return 0
    except HardwareFileError as exc:
        fail(str(exc))
    except BrokenPipeError:  # `python -m hwmodels show x | head`
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
