"""What a GPU run folder holds, as one CSV and a printed table (torch-free: it also runs after ingest).

    python -m workflows.gpu.summary RUN_DIR      # reprint the summary of a run folder or an ingested one
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

from traces.catalog import catalog

SUMMARY_COLUMNS = ("model", "phase", "policy", "cache_ratio", "batch", "context", "kv_tokens", "slots",
                   "median_ms", "p10_ms", "p90_ms", "peak_mem_gib", "dtype", "device")
GIB = 2**30


def timing_folders(root: Path) -> list[Path]:
    """The timing folders below root (traces.catalog: unreadable or foreign manifests are skipped)."""
    return list(catalog(root).timing)


def trace_folders(root: Path) -> list[Path]:
    return list(catalog(root).traces)


def timing_rows(folder: Path) -> pd.DataFrame:
    """One timing folder's points, with the model's name and peak memory in GiB."""
    manifest = json.loads((folder / "manifest.json").read_text())
    table = pd.read_parquet(folder / "timing.parquet")
    # peak_mem_bytes: CUDA peak allocated during the point (weights included); -1 where not tracked (CPU).
    peak = (table["peak_mem_bytes"] if "peak_mem_bytes" in table.columns else pd.Series(-1, index=table.index))
    peak = peak.fillna(-1).astype(float)
    return pd.DataFrame({
        "model": manifest.get("model", {}).get("name", folder.name), "phase": table["phase"],
        "policy": table["policy"], "cache_ratio": table["cache_ratio"], "batch": table["batch"],
        "context": table["context"], "kv_tokens": table["kv_tokens"], "slots": table["slots"],
        "median_ms": table["median_s"] * 1e3, "p10_ms": table["p10_s"] * 1e3, "p90_ms": table["p90_s"] * 1e3,
        "peak_mem_gib": peak.where(peak < 0, peak / GIB), "dtype": manifest.get("dtype", ""),
        "device": manifest.get("env", {}).get("gpu") or manifest.get("device", "")}, columns=list(SUMMARY_COLUMNS))


def collect_timing(root: Path) -> pd.DataFrame:
    frames = [timing_rows(f) for f in timing_folders(root)]
    frames = [f for f in frames if len(f)]
    if not frames:
        return pd.DataFrame(columns=list(SUMMARY_COLUMNS))
    return pd.concat(frames, ignore_index=True).sort_values(
        ["model", "phase", "policy", "cache_ratio", "batch", "context"], ignore_index=True)


def _grid(decode: pd.DataFrame, value: str, fmt: str) -> str:
    setting = [p if p == "full" else f"{p} {r:g}" for p, r in zip(decode["policy"], decode["cache_ratio"])]
    rows = decode.assign(setting=setting, column=[f"b{b} n{n}" for b, n in zip(decode["batch"], decode["context"])])
    table = rows.pivot_table(index="setting", columns="column", values=value, aggfunc="first", sort=False)
    table.index.name = table.columns.name = None
    return table.to_string(float_format=lambda v: fmt.format(v), na_rep="-")


def hardware_lines(root: Path) -> list[str]:
    from hwmodels import load_device

    lines = []
    for path in sorted(Path(root).glob("hw/*.yaml")):
        try:
            device = load_device(path)
        except (ValueError, FileNotFoundError) as exc:
            lines.append(f"{path.name}: unreadable ({exc})")
            continue
        lines.append(f"{path.name} ({device.name}): memory_bw {device.memory_bw / 1e12:.3f} TB/s, "
                     f"bf16 peak {device.peak_flops('bf16') / 1e12:.1f} TFLOP/s, "
                     f"launch {device.launch_overhead_s * 1e6:.2f} us, host step {device.host_overhead_s * 1e6:.1f} us, "
                     f"memory {device.memory_bytes / GIB:.1f} GiB")
    return lines


def capture_lines(root: Path) -> list[str]:
    import traces

    lines = []
    for folder in trace_folders(root):
        try:
            trace = traces.load(folder)
            summary = trace.summary()
            steps = trace.steps
        except (ValueError, FileNotFoundError) as exc:
            lines.append(f"{folder.relative_to(root)}: unreadable ({exc})")
            continue
        decode = steps[steps["phase"] == "decode"].groupby(["policy", "cache_ratio"])["wall_s"].median() * 1e3
        summary["decode_step_ms"] = [decode.get((p, r), float("nan")) for p, r in
                                     zip(summary["policy"], summary["cache_ratio"])]
        peak = steps.groupby(["policy", "cache_ratio"])["peak_mem_bytes"].max()
        summary["peak_mem_mib"] = [peak.get((p, r), -1) / 2**20 if peak.get((p, r), -1) >= 0 else -1
                                   for p, r in zip(summary["policy"], summary["cache_ratio"])]
        m = trace.manifest
        lines.append(f"{folder.relative_to(root)}: {m['model'].get('name')} on {m.get('device')} ({m.get('dtype')}), "
                     f"{len(trace.samples) if hasattr(trace, 'samples') else '?'} samples, "
                     f"{m.get('max_new_tokens')} new tokens, {m.get('dataset', {}).get('mode')}")
        lines.append(summary.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    return lines


def stage_lines(run: dict) -> list[str]:
    lines = []
    for s in run.get("stages", []):
        reason = f"  ({s['reason']})" if s.get("reason") else ""
        lines.append(f"  {s['stage']:<22} {s['status']:<11} {s['wall_s']:7.1f} s of {s['limit_s']:5.0f} s{reason}")
    return lines


def render(root: Path, run: dict | None = None) -> str:
    """The printed summary of a run (or ingested) folder."""
    root = Path(root)
    if run is None and (root / "run.json").exists():
        run = json.loads((root / "run.json").read_text())
    out = []
    if run:
        plan = run.get("plan", {})
        out.append(f"== run {plan.get('name')} on {run.get('device_name')} ({run.get('started')}, "
                   f"{run.get('wall_s', 0):.0f} s of {plan.get('total_s', 0):.0f} s)")
        out += stage_lines(run)
    hw = hardware_lines(root)
    if hw:
        out += ["== calibrated hardware file"] + hw
    timing = collect_timing(root)
    for model, rows in timing.groupby("model", sort=False):
        decode = rows[rows["phase"] == "decode"]
        if len(decode):
            out += [f"== {model}: decode step, median ms ({rows['dtype'].iloc[0]}, {rows['device'].iloc[0]})",
                    _grid(decode, "median_ms", "{:.2f}")]
            if (decode["peak_mem_gib"] >= 0).any():
                out += [f"== {model}: peak memory during the point, GiB", _grid(decode, "peak_mem_gib", "{:.2f}")]
        prefill = rows[rows["phase"] == "prefill"]
        for r in prefill.itertuples():
            out.append(f"   prefill b{r.batch} n{r.context}: {r.median_ms:.2f} ms")
    if not len(timing):
        out.append("== no timing points")
    captures = capture_lines(root)
    out += (["== captured traces"] + captures) if captures else ["== no captured trace"]
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0].startswith("-"):
        print("usage: python -m workflows.gpu.summary RUN_DIR", file=sys.stderr)
        return 2
    root = Path(argv[0])
    if not root.is_dir():
        print(f"error: {root} is not a folder", file=sys.stderr)
        return 2
    sys.stdout.write(render(root))
    return 0


if __name__ == "__main__":
    sys.exit(main())
