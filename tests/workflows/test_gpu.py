"""workflows.gpu: the one-command GPU run (issue 8) and its ingest step, exercised on a CPU.

The end-to-end test runs every stage at tiny shapes (`--device cpu --tiny`) with simpy and rouge_score made
unimportable, as on the GPU machine; the others check the plan, the stage runner's limits, the wrappers
around traces.timing, and ingest's checks and MAPE arithmetic without a model run.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pandas as pd
import pytest

from traces.assets import REPO_ROOT, have_assets
from workflows.gpu import ingest as ingest_mod
from workflows.gpu import plan as plan_mod
from workflows.gpu import run_all
from workflows.gpu.stages import run_stage

PY = sys.executable


# ---- the plan ---------------------------------------------------------------------------------------

def test_full_plan_is_the_issue_grid():
    plan = plan_mod.make_plan("cuda", tiny=False)
    assert plan.models == ("gpt-j-6b", "mpt-7b")
    assert plan.batches == (1, 8) and plan.contexts == (1024, 4096) and plan.dtype == "bf16"
    assert plan.policies == ("full", "keyformer:0.2", "keyformer:0.5", "keyformer:1.0")
    assert plan.total_s <= 480  # the issue's 8 minutes
    argv = plan.timing_argv()
    assert argv[argv.index("--device") + 1] == "cuda" and argv.count("--policy") == 4
    assert plan.points_per_model() == 2 * 2 * 4 + len(plan.prefill)


def test_timing_configs_fit_the_longest_context_and_keep_the_shape(tmp_path):
    plan = plan_mod.make_plan("cuda", tiny=False)
    paths = plan_mod.write_timing_configs(plan, tmp_path)
    gptj = json.loads(paths["gpt-j-6b"].read_text())
    shipped = json.loads((plan_mod.SIM_MODELS_DIR / "gpt-j-6b.json").read_text())
    assert shipped["n_positions"] < 4096 <= gptj["n_positions"]  # 2048 would index past the rotary table
    assert "n_positions raised from 2048" in gptj["_source"]
    assert {k: gptj[k] for k in ("n_embd", "n_layer", "n_head", "vocab_size")} == \
           {k: shipped[k] for k in ("n_embd", "n_layer", "n_head", "vocab_size")}
    from sim.models import load_model
    from traces.timing import max_positions, resolve_config
    for model, path in paths.items():
        name, config = resolve_config(str(path))   # what traces.timing builds, and the folder it names
        assert name == model
        limit = max_positions(config)
        assert limit is None or limit >= max(plan.contexts) + plan.warmup + plan.repeats + 1
    assert load_model(paths["mpt-7b"]).n_layers == 32  # the simulator reads the written config


def test_cpu_without_tiny_is_one_line_and_exit_2(capsys):
    assert run_all.main(["--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --device cpu runs only the --tiny plan")


def test_cuda_without_a_gpu_stops_before_any_stage(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert run_all.main(["--device", "cuda", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "sees no CUDA device" in err[0] and not (tmp_path / "run").exists()


def test_gpu_names_become_slugs_with_datasheets():
    assert run_all.gpu_slug("NVIDIA H200") == "h200" and plan_mod.DATASHEETS["h200"] == "h200-sxm"
    assert run_all.gpu_slug("NVIDIA A100-SXM4-80GB") == "a100"
    assert run_all.gpu_slug("NVIDIA L40S") == "l40s"
    assert run_all.gpu_slug("Some Accelerator") == "cuda"


def test_stage_limits_leave_room_for_later_stages(tmp_path):
    plan = plan_mod.make_plan("cuda", tiny=False, total_s=200.0)
    run = run_all.Run(plan, tmp_path, None, "h200", "NVIDIA H200", skip=set())
    # 200 s - 15 s packing: calibrate keeps the timing and capture reserves (60 + 60) free.
    assert run.limit("calibrate") == pytest.approx(200 - 15 - 120, abs=1)
    assert run.limit("timing") == pytest.approx(200 - 15 - 60, abs=1)
    assert run.limit("capture") == pytest.approx(120, abs=1)   # its cap
    run.to_run = ["timing"]   # nothing after it: all that is left, up to its cap
    assert run.limit("timing") == pytest.approx(200 - 15, abs=1)


# ---- the stage runner -------------------------------------------------------------------------------

def _python(code: str) -> list[str]:
    return [PY, "-c", code]


def test_stage_past_its_limit_is_interrupted_and_keeps_what_it_wrote(tmp_path):
    code = ("import time, pathlib\n"
            "try:\n    time.sleep(60)\n"
            "except KeyboardInterrupt:\n    pathlib.Path('saved.txt').write_text('ok'); print('saved'); raise SystemExit(130)\n")
    started = time.perf_counter()
    result = run_stage("slow", _python(code.replace("'saved.txt'", repr(str(tmp_path / "saved.txt")))),
                       tmp_path / "logs" / "slow.log", 2.0, dict(os.environ), tmp_path, min_s=0)
    assert time.perf_counter() - started < 10
    assert result.status == "timed_out" and result.returncode == 130
    assert (tmp_path / "saved.txt").read_text() == "ok"
    assert "saved" in (tmp_path / "logs" / "slow.log").read_text()


def test_stage_ignoring_sigint_is_killed_after_the_grace(tmp_path):
    code = "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    started = time.perf_counter()
    result = run_stage("stubborn", _python(code), tmp_path / "s.log", 2.0, dict(os.environ), tmp_path, min_s=0)
    assert time.perf_counter() - started < 10
    assert result.status == "timed_out" and result.returncode == -9


def test_failed_stage_reports_its_error_line_and_short_budgets_skip(tmp_path):
    code = "import sys; print('working'); print('error: the model folder is missing', file=sys.stderr); sys.exit(2)"
    result = run_stage("bad", _python(code), tmp_path / "b.log", 30.0, dict(os.environ), tmp_path)
    assert (result.status, result.returncode) == ("failed", 2)
    assert result.reason == "error: the model folder is missing"
    skipped = run_stage("late", _python("pass"), tmp_path / "l.log", 3.0, dict(os.environ), tmp_path)
    assert skipped.status == "skipped" and "3 s left" in skipped.reason and not (tmp_path / "l.log").exists()


# ---- orchestration: a real (calibration-only) run, packed --------------------------------------------

def test_calibration_only_run_writes_record_summary_and_pack(tmp_path):
    pytest.importorskip("torch")
    run_dir, pack_dir = tmp_path / "run", tmp_path / "pack"
    proc = subprocess.run([PY, "-m", "workflows.gpu.run_all", "--device", "cpu", "--tiny", "--out", str(run_dir),
                           "--pack", str(pack_dir), "--skip", "timing", "--skip", "capture"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=180, check=False,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = json.loads((run_dir / "run.json").read_text())
    assert run["kind"] == "kvsim-gpu-run" and run["complete"] is True
    assert [s["stage"] for s in run["stages"]] == ["calibrate"] and run["skipped_by_user"] == ["capture", "timing"]
    from hwmodels import load_device
    device = load_device(run_dir / "hw" / "cpu-calibrated.yaml")
    assert device.memory_bw > 0 and device.calibration
    assert "== calibrated hardware file" in proc.stdout and "cpu-calibrated.yaml" in proc.stdout
    with tarfile.open(pack_dir / "run.tar.gz") as tar:
        names = tar.getnames()
    assert "run/run.json" in names and "run/hw/cpu-calibrated.yaml" in names
    assert (pack_dir / "summary.txt").read_text() == (run_dir / "summary.txt").read_text()
    # Nothing to ingest from a calibration alone: one line, exit 2.
    assert ingest_mod.main([str(pack_dir), "--dest", str(tmp_path / "dest")]) == 2


# ---- ingest -----------------------------------------------------------------------------------------

def _fake_run(root: Path, slowdown: float) -> Path:
    """A run folder with the datasheet H200 as its 'calibrated' file and GPT-J decode points measured
    `slowdown` times slower than predicted on it."""
    from sim.validation.measured import load_timing
    from sim.validation.points import measured_points
    from traces.timing import TIMING_COLUMNS

    run_dir = root / "h200-run"
    (run_dir / "hw").mkdir(parents=True)
    (run_dir / "hw" / "h200-calibrated.yaml").write_text(
        (REPO_ROOT / "hwmodels" / "devices" / "h200-sxm.yaml").read_text())
    folder = run_dir / "timing" / "gpt-j-6b"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text((plan_mod.SIM_MODELS_DIR / "gpt-j-6b.json").read_text())
    (folder / "manifest.json").write_text(json.dumps(
        {"schema_version": 1, "kind": "kvsim-timing", "hw_device": "../../hw/h200-calibrated.yaml",
         "dtype": "bf16", "device": "cuda", "model": {"name": "gpt-j-6b"}, "env": {"threads": 16}}))
    rows = [{"phase": "decode", "policy": p, "cache_ratio": r, "batch": b, "context": n, "kv_tokens": n * r,
             "slots": int(n * r) + 1, "median_s": 1.0, "p10_s": 1.0, "p90_s": 1.0, "mean_s": 1.0, "min_s": 1.0,
             "cpu_median_s": 1.0, "repeats": 10, "warmup": 3, "threads": 16, "omp_wait_policy": "ACTIVE",
             "dtype": "bf16", "load_1min": 0.0, "measured_at": "now"}
            for p, r in (("full", 1.0), ("keyformer", 0.5)) for b in (1, 8) for n in (1024, 4096)]
    pd.DataFrame(rows, columns=list(TIMING_COLUMNS)).to_parquet(folder / "timing.parquet")
    predicted, _ = measured_points(load_timing(folder))
    step = predicted[predicted["metric"] == "step_latency_s"]["predicted"].to_numpy()
    table = pd.DataFrame(rows, columns=list(TIMING_COLUMNS)).assign(median_s=step * slowdown)
    table.to_parquet(folder / "timing.parquet")
    (run_dir / "run.json").write_text(json.dumps({"kind": "kvsim-gpu-run", "device_name": "NVIDIA H200",
                                                  "datasheet_hw": "h200-sxm", "complete": True, "stages": []}))
    return run_dir


def test_ingest_copies_and_indexes_without_predicting(tmp_path):
    run_dir = _fake_run(tmp_path, slowdown=1.25)
    archive = tmp_path / "h200-run.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(run_dir, arcname=run_dir.name)
    dest = tmp_path / "data" / "h200"
    index = ingest_mod.ingest(archive, dest)
    assert index["timing"] == ["timing/gpt-j-6b"] and index["hw"] == ["hw/h200-calibrated.yaml"]
    # the datasheet file is recorded for sim.validate; ingest predicts nothing (no MAPE, no comparison file)
    assert index["source"]["sha256"] and index["datasheet_hw"] == "h200-sxm" and "mape" not in index
    assert not (dest / "hw_comparison.csv").exists()
    assert not (dest / "manifest.json").exists()   # it would hide the timing folders from sim.validate
    from sim.validation.measured import find_timing_folders, load_timing
    [found] = find_timing_folders([dest])
    assert Path(load_timing(found).hw).is_file()    # the relative hardware path still resolves
    # the measured values travel unchanged
    assert pd.read_parquet(found / "timing.parquet")["median_s"].tolist() == \
        pd.read_parquet(run_dir / "timing" / "gpt-j-6b" / "timing.parquet")["median_s"].tolist()
    # An existing destination needs --replace; with it the folder is replaced whole.
    assert ingest_mod.main([str(archive), "--dest", str(dest)]) == 2
    assert ingest_mod.main([str(run_dir), "--dest", str(dest), "--replace", "--no-compare"]) == 0
    assert json.loads((dest / "index.json").read_text())["timing"] == ["timing/gpt-j-6b"]


def test_ingest_imports_no_simulator():
    code = ("import sys, workflows.gpu.ingest, workflows.gpu.summary\n"
            "bad = sorted(n for n in sys.modules if n.split('.')[0] in ('sim', 'torch'))\n"
            "assert not bad, bad[:5]\n")
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True)


def test_ingest_refuses_unsafe_or_unreadable_sources(tmp_path, capsys):
    evil = tmp_path / "evil.tar.gz"
    payload = tmp_path / "payload.txt"
    payload.write_text("x")
    with tarfile.open(evil, "w:gz") as tar:
        tar.add(payload, arcname="../outside.txt")
    broken = tmp_path / "broken.tar.gz"
    broken.write_bytes(b"not a tar")
    for source in (evil, broken, tmp_path / "missing.tar.gz", tmp_path):
        capsys.readouterr()
        assert ingest_mod.main([str(source), "--dest", str(tmp_path / "d")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ")
    assert not (tmp_path.parent / "outside.txt").exists() and not (tmp_path / "d").exists()


@pytest.mark.parametrize("content, message", [('{"kind": "kvsim-timing"}', "not a GPU run record of kind"),
                                              ("[1, 2]", "not a JSON object"), ("{", "unreadable")])
def test_ingest_refuses_a_run_record_of_another_kind(tmp_path, capsys, content, message):
    run_dir = _fake_run(tmp_path, slowdown=1.0)
    (run_dir / "run.json").write_text(content)
    assert ingest_mod.main([str(run_dir), "--dest", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and "run.json" in err[0]
    assert not (tmp_path / "d").exists()


# ---- end to end at tiny shapes -----------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.assets
def test_tiny_run_end_to_end_then_ingest(tmp_path):
    pytest.importorskip("torch")
    carried = REPO_ROOT / ".carry" / "assets"
    if not (carried.is_dir() or have_assets("stories260K", "hf")):
        pytest.skip("stories260K assets absent (../shared/assets or .carry/assets)")
    # The GPU machine has neither simpy nor rouge-score: make them unimportable for every stage.
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    for name in ("simpy", "rouge_score"):
        (blocked / f"{name}.py").write_text(f"raise ImportError('{name} is not on the GPU machine')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(blocked), str(REPO_ROOT)]), OMP_NUM_THREADS="1")
    run_dir, pack_dir = tmp_path / "run", tmp_path / "pack"
    started = time.perf_counter()
    proc = subprocess.run([PY, "-m", "workflows.gpu.run_all", "--device", "cpu", "--tiny", "--out", str(run_dir),
                           "--pack", str(pack_dir)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, env=env, check=False)
    wall = time.perf_counter() - started
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = json.loads((run_dir / "run.json").read_text())
    assert [s["stage"] for s in run["stages"]] == ["calibrate", "timing:gpt-j-6b", "timing:mpt-7b", "capture"]
    assert all(s["status"] == "ok" for s in run["stages"]) and run["wall_s"] <= min(wall, run["plan"]["total_s"])
    import traces
    from hwmodels import load_device
    from sim.validation.measured import load_timing
    device = load_device(run_dir / "hw" / "cpu-calibrated.yaml")
    assert device.memory_bw > 0
    threads = run["versions"]["torch_threads"]   # what the stages' torch uses by default
    assert device.calibration["env"]["torch_threads"] == threads
    plan = plan_mod.make_plan("cpu", tiny=True)
    for model in ("gpt-j-6b", "mpt-7b"):
        source = load_timing(run_dir / "timing" / model)
        assert len(source.table) == plan.points_per_model() and (source.table["median_s"] > 0).all()
        assert source.manifest["hw_device"] == "../../hw/cpu-calibrated.yaml" and source.dtype == "bf16"
        assert source.manifest["env"]["threads"] == threads   # timed as calibrated: no sim.validate warning
        assert (source.table["peak_mem_bytes"] == -1).all()   # not tracked on a CPU
    config = json.loads((run_dir / "timing" / "gpt-j-6b" / "config.json").read_text())
    assert config["model_type"] == "gptj" and config["n_positions"] >= 64   # raised past the tiny limit of 48
    trace = traces.load(run_dir / "traces" / "stories260k" / "tinystories")
    assert trace.manifest["model"]["trained"] is True
    assert set(trace.kv["policy"]) == {"full", "keyformer"} and set(trace.kv["cache_ratio"]) == {0.5, 1.0}
    summary = pd.read_csv(run_dir / "summary.csv")
    assert len(summary) == 2 * plan.points_per_model()
    assert "gpt-j-6b: decode step, median ms" in proc.stdout and "stories260k" in proc.stdout
    # Ingest what came back (the pack folder, as the device tool hands it over) and check sim.validate's view.
    dest = tmp_path / "data" / "h200"
    assert ingest_mod.main([str(pack_dir), "--dest", str(dest)]) == 0
    index = json.loads((dest / "index.json").read_text())
    assert index["timing"] == ["timing/gpt-j-6b", "timing/mpt-7b"] and index["traces"] == ["stories260k/tinystories"]
    assert traces.load(dest / "stories260k" / "tinystories").kv_override("keyformer", 0.5, 100, 10, 4).shape == (11, 4)
    bundled = REPO_ROOT / "traces" / "data" / "stories260k" / "tinystories"
    if (bundled / "manifest.json").is_file():
        # Same samples (seeded order), same fp32 CPU capture: the full cache must reproduce the bundled run.
        [match] = index["traces_vs_bundled"]
        full = [r for r in match["rows"] if r["policy"] == "full"]
        if full and not pd.isna(full[0]["runs"]):   # the bundled capture has full runs of these samples
            assert full[0]["identical_tokens"] == full[0]["runs"] and full[0]["same_kv_len_share"] == 1.0
    validate = subprocess.run([PY, "-m", "sim.validate", "--measured", str(dest), "--no-references", "--json",
                               "--quiet", "--out", str(tmp_path / "report")], cwd=REPO_ROOT, capture_output=True,
                              text=True, timeout=120, check=False)
    assert validate.returncode == 0, validate.stderr
    assert json.loads(validate.stdout)["points"] >= 2 * plan.points_per_model()
