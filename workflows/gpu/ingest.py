"""`python -m workflows.gpu.ingest SOURCE`: bring a GPU run home into traces/data/h200/ for sim.validate.

SOURCE is what came back from the device machine: the RUN.tar.gz (or the folder holding it, e.g. the device
tool's files_at), or an unpacked run folder (one with run.json). Everything is checked before anything is
written: the hardware file loads with hwmodels, every timing folder loads as sim.validate reads it, every
trace folder loads with traces.load (an unfinished capture is reported and left out). The destination is
then replaced as a whole (--replace needed when it exists):

    traces/data/h200/
      index.json            what is here: source file and sha256, device, stages, folders, datasheet file
      hw/<gpu>-calibrated.yaml       the calibrated hardware file (timing manifests name it by relative path)
      timing/<model>/       kvsim-timing folders (sim.validate finds them: origin "h200")
      <model>/<dataset>/    trace folders (traces.load, traces.bundled)
      run.json, summary.csv, summary.txt, logs/
      <model>_<dataset>_vs_bundled.csv   the trace against the bundled capture of the same samples

Ingest predicts nothing (it imports no sim): it only checks and converts measured files into the timing and
trace formats (traces.timing_format, traces.load). The index records the datasheet file (run.json's
datasheet_hw, or --datasheet) the calibrated one is to be compared against; `python -m sim.validate` predicts
the points. The index is index.json, not manifest.json: a manifest.json at the top would hide the timing folders
below it from sim.validate's search.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tarfile
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from kvcommon.cli import OneLineParser, run
from traces.assets import DATA_DIR, REPO_ROOT
from traces.timing_format import load_timing, read_record
from workflows.gpu.summary import collect_timing, render, timing_folders, trace_folders

DEFAULT_DEST = DATA_DIR / "h200"
RUN_KIND = "kvsim-gpu-run"
INDEX_KIND = "kvsim-gpu-results"


class IngestError(ValueError):
    """A source or destination problem: one line, `error: ...` and exit 2 from the CLI."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _extract(archive: Path, into: Path) -> Path:
    """Unpack a run tarball safely (no absolute paths, no '..', no links out); returns the run folder."""
    try:
        with tarfile.open(archive) as tar:
            members = tar.getmembers()
            for m in members:
                parts = Path(m.name).parts
                if m.name.startswith("/") or ".." in parts or not (m.isfile() or m.isdir()):
                    raise IngestError(f"{archive}: refusing member {m.name!r} (absolute, '..' or not a plain file)")
            if hasattr(tarfile, "data_filter"):
                tar.extractall(into, filter="data")
            else:  # pragma: no cover - Python < 3.11.4; members were checked above
                tar.extractall(into)
    except (tarfile.TarError, EOFError, OSError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise IngestError(f"{archive}: not a readable tar archive ({first})") from None
    runs = sorted(p.parent for p in into.glob("*/run.json")) or sorted(p.parent for p in into.glob("run.json"))
    if len(runs) != 1:
        raise IngestError(f"{archive}: expected one run folder (with run.json) inside, found {len(runs)}")
    return runs[0]


def resolve_source(source: Path, scratch: Path) -> tuple[Path, Path | None]:
    """(run folder, archive it came from or None)."""
    if not source.exists():
        raise FileNotFoundError(f"{source} not found")
    if source.is_file():
        return _extract(source, scratch), source
    if (source / "run.json").is_file():
        return source, None
    archives = sorted(p for p in source.iterdir() if p.name.endswith((".tar.gz", ".tgz", ".tar")))
    if len(archives) != 1:
        raise IngestError(f"{source}: neither a run folder (run.json) nor a folder with exactly one run "
                          f"archive (found {len(archives)})")
    return _extract(archives[0], scratch), archives[0]


def read_run(run_dir: Path) -> dict:
    """run.json of a GPU run folder (kind kvsim-gpu-run), read as the timing manifests are."""
    try:
        return read_record(run_dir / "run.json", RUN_KIND, "a GPU run record")
    except ValueError as exc:
        raise IngestError(str(exc)) from None


def check_run(run_dir: Path) -> dict:
    """Load everything the destination will hold; returns {hw, timing, traces, skipped} (paths relative)."""
    import traces
    from hwmodels import load_device

    read_run(run_dir)
    found = {"hw": [], "timing": [], "traces": [], "skipped": []}
    for path in sorted(run_dir.glob("hw/*.yaml")):
        try:
            load_device(path)
        except (ValueError, FileNotFoundError) as exc:
            raise IngestError(f"{path}: the hardware file does not load ({exc})") from None
        found["hw"].append(path.relative_to(run_dir).as_posix())
    for folder in timing_folders(run_dir):
        source = load_timing(folder)   # the timing-folder reader sim.validate reads it with
        hw = source.manifest["hw_device"]
        if hw.endswith((".yaml", ".yml")) and not Path(source.hw).is_file():
            raise IngestError(f"{folder}: names hardware file {hw}, which is not in the run folder")
        if len(source.table):
            found["timing"].append(folder.relative_to(run_dir).as_posix())
        else:
            found["skipped"].append(f"{folder.relative_to(run_dir).as_posix()}: no points")
    for folder in trace_folders(run_dir):
        try:
            traces.load(folder)
            found["traces"].append(folder.relative_to(run_dir).as_posix())
        except ValueError as exc:
            found["skipped"].append(f"{folder.relative_to(run_dir).as_posix()}: {exc}")
    for config in run_dir.glob("traces/**/capture.json"):
        if not (config.parent / "manifest.json").exists():
            found["skipped"].append(f"{config.parent.relative_to(run_dir).as_posix()}: capture not finished")
    if not (found["timing"] or found["traces"]):
        raise IngestError(f"{run_dir}: no timing points and no finished trace to ingest")
    return found


def _dest_name(rel: str) -> str:
    """Where a run-folder path lands: traces/<model>/<dataset> -> <model>/<dataset>; the rest keeps its path."""
    return rel.removeprefix("traces/")


def compare_traces(trace_dir: Path, reference_dir: Path) -> pd.DataFrame:
    """Per policy x cache ratio, how a trace captured here matches another capture of the same samples
    (the bundled CPU trace): runs in common, runs whose generated tokens are identical (over the length both
    generated), the share of (step, layer, head) rows holding the same number of tokens, and the mean
    |difference| of retained attention mass. Keyformer's Gumbel noise comes from a generator on the capture's device, so its runs are
    not expected to match across devices; full and h2o are deterministic up to floating-point order."""
    import traces

    ours, ref = traces.load(trace_dir), traces.load(reference_dir)
    keys = ["sample", "policy", "cache_ratio"]
    texts = ours.texts[keys + ["tokens"]].merge(ref.texts[keys + ["tokens"]], on=keys, suffixes=("", "_ref"))
    # Over the tokens both generated (the captures may differ in --max-new-tokens).
    texts["identical_tokens"] = [list(a)[:min(len(a), len(b))] == list(b)[:min(len(a), len(b))]
                                 for a, b in zip(texts["tokens"], texts["tokens_ref"])]
    kv_keys = keys + ["step", "layer", "head"]
    kv = ours.kv[kv_keys + ["kv_len", "mass_retained"]].merge(
        ref.kv[kv_keys + ["kv_len", "mass_retained"]], on=kv_keys, suffixes=("", "_ref"))
    kv["same_kv_len"] = kv["kv_len"] == kv["kv_len_ref"]
    kv["mass_abs_diff"] = (kv["mass_retained"] - kv["mass_retained_ref"]).abs()
    by_text = texts.groupby(["policy", "cache_ratio"], as_index=False).agg(
        runs=("identical_tokens", "size"), identical_tokens=("identical_tokens", "sum"))
    by_kv = kv.groupby(["policy", "cache_ratio"], as_index=False).agg(
        kv_rows=("same_kv_len", "size"), same_kv_len_share=("same_kv_len", "mean"),
        mass_abs_diff_mean=("mass_abs_diff", "mean"))
    return by_text.merge(by_kv, on=["policy", "cache_ratio"], how="outer")


def ingest(source: Path, dest: Path = DEFAULT_DEST, replace_existing: bool = False,
           datasheet: str | None = None, compare: bool = True) -> dict:
    """Check, copy and index a run; returns the index written to dest/index.json."""
    dest = Path(dest).resolve()
    if dest.exists() and not dest.is_dir():
        raise IngestError(f"--dest {dest} is a file, not a folder")
    if dest.exists() and any(dest.iterdir()) and not replace_existing:
        raise IngestError(f"{dest} exists and is not empty: pass --replace to replace it")
    with tempfile.TemporaryDirectory(prefix="kvsim-ingest-") as scratch:
        run_dir, archive = resolve_source(Path(source), Path(scratch))
        found = check_run(run_dir)
        run = read_run(run_dir)
        dest.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=dest.name + ".", dir=dest.parent))
        try:
            for rel in found["hw"]:
                (staging / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(run_dir / rel, staging / rel)
            for rel in found["timing"] + found["traces"]:
                shutil.copytree(run_dir / rel, staging / _dest_name(rel),
                                ignore=shutil.ignore_patterns("*.tmp", "shards", "capture.json"))
            if (run_dir / "logs").is_dir():
                shutil.copytree(run_dir / "logs", staging / "logs")
            shutil.copy2(run_dir / "run.json", staging / "run.json")
            for rel in found["timing"]:   # the hardware path each manifest names must still resolve
                manifest = json.loads((staging / rel / "manifest.json").read_text())
                hw = manifest["hw_device"]
                if hw.endswith((".yaml", ".yml")) and not (staging / rel / hw).resolve().is_file():
                    raise IngestError(f"{rel}: its hardware file {hw} does not resolve after ingest")
            collect_timing(staging).to_csv(staging / "summary.csv", index=False, float_format="%.6g")
            (staging / "summary.txt").write_text(render(staging, run))
            datasheet = datasheet or run.get("datasheet_hw")
            trace_match = []
            for rel in found["traces"]:   # against the bundled capture of the same model and dataset
                reference = DATA_DIR / _dest_name(rel)
                if compare and (reference / "manifest.json").is_file():
                    table_match = compare_traces(staging / _dest_name(rel), reference)
                    name = _dest_name(rel).replace("/", "_") + "_vs_bundled.csv"
                    table_match.to_csv(staging / name, index=False, float_format="%.6g")
                    trace_match.append({"trace": _dest_name(rel), "reference": reference.relative_to(REPO_ROOT).as_posix(),
                                        "rows": table_match.round(6).to_dict("records")})
            index = {
                "kind": INDEX_KIND, "schema_version": 1,
                "ingested": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "source": {"file": archive.name if archive else None,
                           "sha256": _sha256(archive) if archive else None, "run_folder": run_dir.name},
                "device_name": run.get("device_name"), "plan": run.get("plan", {}).get("name"),
                "complete": run.get("complete"),
                "stages": [{k: s.get(k) for k in ("stage", "status", "wall_s", "limit_s", "reason")}
                           for s in run.get("stages", [])],
                "hw": found["hw"], "timing": [_dest_name(r) for r in found["timing"]],
                "traces": [_dest_name(r) for r in found["traces"]], "left_out": found["skipped"],
                "datasheet_hw": datasheet,
                "traces_vs_bundled": trace_match,
            }
            (staging / "index.json").write_text(json.dumps(index, indent=2) + "\n")
            if dest.exists():
                old = dest.with_name(dest.name + ".old")
                shutil.rmtree(old, ignore_errors=True)
                os.replace(dest, old)
                os.replace(staging, dest)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(staging, dest)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return index


def main(argv=None) -> int:
    return run(_main, argv)


def _main(argv=None) -> int:
    parser = OneLineParser(prog="python -m workflows.gpu.ingest",
                     description="Unpack a GPU run (RUN.tar.gz or run folder) into traces/data/h200/ for sim.validate.")
    parser.add_argument("source", type=Path, help="RUN.tar.gz, a folder holding exactly one, or a run folder")
    parser.add_argument("--dest", type=Path, default=DEFAULT_DEST, help=f"default {DEFAULT_DEST.relative_to(REPO_ROOT)}")
    parser.add_argument("--replace", action="store_true", help="replace an existing destination")
    parser.add_argument("--datasheet", default=None,
                        help="hardware file the calibrated one is to be compared against, recorded in the index "
                             "(default: run.json's datasheet_hw, e.g. h200-sxm)")
    parser.add_argument("--no-compare", action="store_true", help="skip the comparison with the bundled traces")
    try:
        args = parser.parse_args(argv)
        index = ingest(args.source, args.dest, args.replace, args.datasheet, not args.no_compare)
    except (IngestError, ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    dest = Path(args.dest).resolve()
    print(f"ingested into {dest}: {len(index['timing'])} timing folder(s), {len(index['traces'])} trace folder(s), "
          f"hardware {', '.join(index['hw']) or 'none'}")
    for item in index["left_out"]:
        print(f"  left out: {item}")
    for match in index["traces_vs_bundled"]:
        print(f"{match['trace']} against {match['reference']}:")
        print(pd.DataFrame(match["rows"]).to_string(index=False))
    print("next: python -m sim.validate   (it finds the timing folders under traces/data/ and predicts them)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
