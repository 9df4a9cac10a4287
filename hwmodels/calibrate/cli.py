"""`python -m hwmodels.calibrate --device cpu|cuda [--out FILE] [--name NAME] [--quick | --thorough]`,
or `python -m hwmodels.calibrate --merge A.yaml B.yaml [...] --out FILE [--name NAME]` (no torch)."""
from __future__ import annotations

import datetime
import os
import platform
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy

from kvcommon.cli import OneLineParser, fail, progress_disabled

from ..errors import HardwareFileError
from ..units import format_quantity
from . import hostinfo
from .document import Provenance, build_document, write_and_check
from .fit import fit, human_bytes
from .merge import merge_files
from .plan import Plan, make_plan


def prepare_openmp() -> str:
    """OpenMP reads OMP_WAIT_POLICY when torch loads, so it must be set before the lazy
    import. Returns the value in effect (recorded in the file)."""
    if os.environ.get("OMP_WAIT_POLICY") is None:
        if "torch" in sys.modules:
            # Someone imported torch before us: setting the variable now would be a lie.
            print("warning: torch was imported before OMP_WAIT_POLICY was set; recording it as unset",
                  file=sys.stderr)
            return "unset (torch imported first)"
        os.environ["OMP_WAIT_POLICY"] = "ACTIVE"
    return os.environ["OMP_WAIT_POLICY"]


def import_torch(device: str):
    try:
        import torch
    except ImportError:
        fail("hwmodels.calibrate needs torch (pip install torch==2.13.0, or the project's 'capture' extra)")
    if device == "cuda" and not torch.cuda.is_available():
        fail(f"--device cuda: torch.cuda is not available here (torch {torch.__version__}"
             f"{', built without CUDA' if torch.version.cuda is None else ', no GPU visible'}); "
             "use --device cpu")
    return torch


def device_facts(device: str, torch) -> dict:
    """Name, description, memory and backend settings of the measured device."""
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        return {
            "description": f"{props.name} (CUDA device 0, {props.multi_processor_count} SMs), calibrated",
            "memory_bytes": float(props.total_memory),
            "memory_how": "torch.cuda.get_device_properties(0).total_memory",
            "llc_bytes": getattr(props, "L2_cache_size", None),
            "settings": {"cuda_device": props.name, "cuda_version": str(torch.version.cuda),
                         "fp32_matmul_precision": torch.get_float32_matmul_precision()},
        }
    memory, how = hostinfo.physical_memory_bytes()
    return {
        "description": (f"{hostinfo.cpu_model()} ({os.cpu_count()} logical CPUs, "
                        f"{torch.get_num_threads()} torch threads), calibrated"),
        "memory_bytes": memory,
        "memory_how": how,
        "llc_bytes": hostinfo.last_level_cache_bytes(),
        "settings": {"cpu": hostinfo.cpu_model(), "logical_cpus": os.cpu_count(),
                     "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "unset")},
    }


def output_problem(flag: str, path: Path) -> str | None:
    """Why `path` cannot be a calibrated hardware file to write (one line naming `flag`), or None."""
    if path.suffix not in (".yaml", ".yml"):
        return f"{flag} must end in .yaml or .yml, got {path}"
    if not path.parent.is_dir():
        return f"{flag}: directory {path.parent} does not exist"
    return None


def parse_args(argv):
    parser = OneLineParser(
        prog="python -m hwmodels.calibrate",
        description="Measure the local device with microbenchmarks (read/copy bandwidth, GEMV and GEMM "
                    "over sizes, dispatch overhead) and write a hardware file of the hwmodels schema; or "
                    "merge several such files (--merge) into their per-point median.")
    parser.add_argument("--device", choices=("cpu", "cuda"))
    parser.add_argument("--merge", nargs="+", type=Path, metavar="FILE",
                        help="calibrated files of one device, thread count and mode: write the median of "
                             "their raw series, refitted (no measurement, no torch)")
    parser.add_argument("--partial-series", action="store_true",
                        help="with --merge: keep a series only some files have (a newer plan's), as the median "
                             "over those files; the output's notes name it and its run count")
    parser.add_argument("--out", type=Path, help="output YAML (default: ./<name>.yaml); to ship it as a "
                        "device, write hwmodels/devices/<name>.yaml")
    parser.add_argument("--name", help="device name in the file (default: <device>-local, or the first "
                        "merged file's name)")
    parser.add_argument("--quick", action="store_true",
                        help="a few seconds, few sizes, warm caches: for tests, not for predictions")
    parser.add_argument("--thorough", action="store_true",
                        help="the full plan (CPU: 1 GiB stream point, 4096^3 bf16 GEMM, 11 repeats; several "
                             "minutes, the plan of the committed calibrations); default on a CPU: the standard "
                             "plan (under 2 minutes on a busy 2-core machine)")
    args = parser.parse_args(argv)
    if (args.device is None) == (args.merge is None):
        parser.error("give either --device (measure) or --merge FILE... (combine calibrations)")
    if args.merge and (args.quick or args.thorough):
        parser.error(f"{'--quick' if args.quick else '--thorough'} measures; it has no meaning with --merge")
    if args.quick and args.thorough:
        parser.error("give --quick or --thorough, not both")
    if args.partial_series and not args.merge:
        parser.error("--partial-series only applies to --merge")
    if args.merge and args.out is None:
        parser.error("--merge needs --out")
    args.name = args.name or (None if args.merge else f"{args.device}-local")
    if args.name is not None and (not args.name or any(c.isspace() or c in "/\\" for c in args.name)):
        parser.error(f"--name must be one word without slashes, got {args.name!r}")
    args.out = args.out or Path(f"{args.name}.yaml")
    problem = output_problem("--out", args.out)
    if problem:
        parser.error(problem)
    return args


@dataclass
class Calibration:
    """One run of the microbenchmarks: the raw series and everything the file says about them."""
    series: dict
    prov: Provenance
    facts: dict
    plan: Plan


def measure(device: str, quick: bool, omp: str, progress=None, say=None, own_load: float = 0.0,
            thorough: bool = True) -> Calibration:
    """Run the plan's microbenchmarks in this process (torch threads as currently set); `thorough`: the
    full plan (default here, as traces.timing --calibrate needs), else the standard one (plan.make_plan).
    `progress(label)` is called after each point, `say(line)` for the start line and warnings.
    `own_load`: busy threads that belong to the caller itself (e.g. traces.timing's spinning measurement
    threads, which keep the 1-minute load average near their count); subtracted from the load average
    before it is compared with hostinfo.BUSY_LOAD.
    Raises RuntimeError when a benchmark fails (e.g. out of memory for the buffer pool)."""
    say = say or (lambda line: print(line, file=sys.stderr))
    started = time.perf_counter()
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    load_before = hostinfo.load_average()
    torch = import_torch(device)

    from .bench import make_timer, run_all

    plan = make_plan(device, quick, thorough)
    facts = device_facts(device, torch)
    say(f"calibrating {device} ({plan.mode}): OMP_WAIT_POLICY={omp}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, load average {load_before}")
    if device == "cpu" and hostinfo.contended(load_before, own_load):
        # Spinning OpenMP threads that lose their core stall a parallel op for a scheduler
        # tick (~4-16 ms): timings under load are inflated, sometimes by orders of magnitude.
        own = f" ({own_load:g} of it this process's own threads)" if own_load else ""
        say(f"warning: load average {load_before[0]} before start{own}: other processes compete for "
            f"the {os.cpu_count()} CPUs and will inflate the timings; rerun on a quiet machine")
    series = run_all(plan, progress)
    prov = Provenance(
        device=device, mode=plan.mode, host=socket.gethostname(),
        date=date,
        omp_wait_policy=omp, torch_version=str(torch.__version__), threads=torch.get_num_threads(),
        repeats=plan.repeats, timer=make_timer(device).name,
        wall_time_s=time.perf_counter() - started, load_before=load_before,
        load_after=hostinfo.load_average(), own_load=own_load, llc_bytes=facts["llc_bytes"], pool_bytes=plan.pool_bytes,
        settings=facts["settings"], python_version=platform.python_version(),
        numpy_version=numpy.__version__)
    return Calibration(series, prov, facts, plan)


def write_calibration(cal: Calibration, name: str, out: Path):
    """Fit, write `out` atomically and load it back through the schema; returns the Device.
    Raises OSError / HardwareFileError."""
    result = fit(cal.series, cal.plan.primary_dtype)
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    doc = build_document(name, cal.facts["description"], cal.facts["memory_bytes"], cal.facts["memory_how"],
                         result, cal.series, cal.prov, cal.plan.primary_dtype)
    return write_and_check(out, doc)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.merge:
        return main_merge(args)
    omp = prepare_openmp()
    import_torch(args.device)   # a missing torch or GPU is one line before any bar appears
    from tqdm import tqdm

    plan = make_plan(args.device, args.quick, args.thorough)
    try:
        with tqdm(total=plan.n_points(), desc=f"calibrate {args.device}", unit="pt",
                  file=sys.stderr, leave=False, disable=progress_disabled()) as bar:
            def progress(label):
                bar.set_postfix_str(label, refresh=False)
                bar.update(1)
            cal = measure(args.device, args.quick, omp, progress, say=bar.write, thorough=args.thorough)
    except KeyboardInterrupt:
        print("error: interrupted; nothing written", file=sys.stderr)
        return 130
    except RuntimeError as exc:  # e.g. out of memory for the buffer pool
        fail(f"benchmark failed: {str(exc).splitlines()[0]}")
    try:
        device = write_calibration(cal, args.name, args.out)
    except OSError as exc:
        fail(f"cannot write {args.out}: {exc.strerror or exc}")
    except HardwareFileError as exc:  # would be a bug in the fit: say so in one line
        fail(f"calibration produced an invalid file: {exc}")
    print_summary(device, cal.series, cal.prov, args.out)
    return 0


def main_merge(args) -> int:
    try:
        device = merge_files(args.merge, args.out, args.name, partial=args.partial_series)
    except FileNotFoundError as exc:
        fail(f"--merge: {exc.filename}: no such file")
    except OSError as exc:
        fail(f"cannot write {args.out}: {exc.strerror or exc}")
    except HardwareFileError as exc:  # would be a bug in the merge or fit: say so in one line
        fail(f"merge produced an invalid file: {exc}")
    except ValueError as exc:
        fail(str(exc))
    print(f"wrote {args.out} ({device.name}): median over {len(args.merge)} calibration runs; "
          f"memory_bw {format_quantity(device.memory_bw, 'bandwidth')}, "
          f"dispatch {device.launch_overhead_s * 1e6:.2f} us per op")
    return 0


def print_summary(device, series, prov, out) -> None:
    def best(name, kind):
        if name not in series:
            return "n/a"
        rate, size = series[name].best()
        where = human_bytes(size) if kind == "bandwidth" else format_quantity(size, "ops")
        return f"{format_quantity(rate, kind)} (at {where})"

    print(f"wrote {out} ({device.name}, {prov.mode}) in {prov.wall_time_s:.1f} s; "
          f"load average before {prov.load_before}, after {prov.load_after}")
    print(f"  read bandwidth   {best('read', 'bandwidth')}")
    print(f"  copy bandwidth   {best('copy', 'bandwidth')}  (read + write bytes)")
    for name in series:
        if name.startswith("gemv_"):
            print(f"  {name:<16} {best(name, 'bandwidth')}")
    for name in series:
        if name.startswith("gemm_"):
            print(f"  {name:<16} {best(name, 'ops_rate')}")
    print(f"  dispatch         {device.launch_overhead_s * 1e6:.2f} us per op; host step "
          f"{device.host_overhead_s * 1e6:.1f} us")
    if device.tables.eager_call_overhead_s is not None:
        print(f"  eager call       {device.tables.eager_call_overhead_s * 1e6:.2f} us per top-level call")
    if device.tables.eager_weight_switch_s is not None:
        print(f"  eager switch     {device.tables.eager_weight_switch_s * 1e6:.1f} us per streamed weight GEMV")
    print(f"  memory_bw (peak) {format_quantity(device.memory_bw, 'bandwidth')}")
