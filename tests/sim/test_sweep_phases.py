"""`python -m sim.sweep` at scale: local processes, a Dask cluster, the per-point cache and resume,
trace-driven points joined with measured quality, the DES engine, run options in YAML, errors."""
from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from sim import runner, sweep
from sim.cli import run
from tests.helpers import assert_one_line_error
from tests.sim.conftest import real_device_names
from tests.sim.test_tradeoff import write_fixture_trace

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not {"h100-sxm", "l4"} <= set(real_device_names()),
                                reason="hwmodels devices not shipped yet")
SMALL = ["--hw", "h100-sxm,l4", "--models", "llama-3-8b", "--policies", "full,h2o,keyformer",
         "--cache-ratios", "0.2,0.5,1.0", "--batches", "1,16", "--prompts", "1024", "--gens", "128", "--no-plots"]


def sweep_cli(argv, capsys):
    code = run(sweep.main, argv)
    out, err = capsys.readouterr()
    return code, out, err


def points_table(out_dir: Path) -> pd.DataFrame:
    return pd.read_parquet(out_dir / "points.parquet")


@pytest.fixture
def no_traces():
    return ["--traces", "none"]


def test_grid_is_the_cartesian_product_in_axis_order():
    config = sweep.GridConfig(hw=["h100-sxm", "l4"], models=["llama-3-8b", "gpt2"], policies=["full", "h2o"],
                              cache_ratios=[0.5, 1.0], batches=[1, 4], prompts=[64], gens=[8, 16])
    grid = sweep.build_grid(config)
    axes = [config.hw, config.models, config.policies, config.cache_ratios, config.recent_ratios, config.batches,
            config.beams, config.prompts, config.gens, config.kv_dtypes, config.weight_dtypes, config.profiles]
    expected = pd.DataFrame(list(itertools.product(*axes)), columns=sweep.INPUT_COLUMNS)
    # the default profile `auto` is named by each device's default (GPU: trtllm) in the table
    expected["profile"] = expected["profile"].replace({"auto": "trtllm"})
    assert grid[sweep.INPUT_COLUMNS].astype(object).equals(expected.astype(object))


def test_cache_keys_use_content_hashes_not_names():
    grid = sweep.build_grid(sweep.GridConfig(hw=["l4"], models=["gpt2"], batches=[1], prompts=[64], gens=[8]))
    keys = sweep.cache_key_columns(grid)
    assert {"hw_hash", "model_hash", "policy", "cache_ratio", "batch"} <= set(keys)
    assert "hw" not in keys and "model" not in keys


def test_rerun_is_served_from_the_cache(tmp_path, capsys, no_traces):
    args = SMALL + no_traces + ["--cache-dir", str(tmp_path / "cache")]
    code, _, err = sweep_cli(args + ["--out", str(tmp_path / "a")], capsys)
    assert code == 0, err
    assert "0 from cache" in err
    code, _, err = sweep_cli(args + ["--out", str(tmp_path / "b")], capsys)
    assert code == 0 and "36 from cache" in err
    pd.testing.assert_frame_equal(points_table(tmp_path / "a"), points_table(tmp_path / "b"))
    summary = (tmp_path / "b" / "summary.md").read_text()
    assert "0 computed" in summary and "36 from the cache" in summary and "code version" in summary


def test_editing_a_device_file_recomputes_only_its_points(tmp_path, capsys, no_traces):
    from hwmodels import load_device
    mine = tmp_path / "my-l4.yaml"
    shutil.copy(load_device("l4").source_path, mine)
    args = ["--hw", f"h100-sxm,{mine}"] + SMALL[2:] + no_traces + ["--cache-dir", str(tmp_path / "c")]
    assert sweep_cli(args + ["--out", str(tmp_path / "a")], capsys)[0] == 0
    mine.write_text(mine.read_text() + "\n# edited: same numbers, new content\n")
    code, _, err = sweep_cli(args + ["--out", str(tmp_path / "b")], capsys)
    assert code == 0 and "18 from cache" in err  # the h100 half; the edited file's half is recomputed


def test_no_cache_writes_no_cache(tmp_path, capsys, no_traces, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = sweep_cli(SMALL + no_traces + ["--no-cache", "--out", "o"], capsys)
    assert code == 0, err
    assert not (tmp_path / ".cache").exists()


def test_local_processes_and_a_dask_cluster_give_the_same_table(tmp_path, capsys, no_traces):
    distributed = pytest.importorskip("distributed")
    base = SMALL + no_traces + ["--no-cache"]
    assert sweep_cli(base + ["--out", str(tmp_path / "local")], capsys)[0] == 0
    code, _, err = sweep_cli(base + ["--workers", "2", "--out", str(tmp_path / "procs")], capsys)
    assert code == 0, err
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster:
        code, _, err = sweep_cli(base + ["--scheduler", cluster.scheduler_address, "--out", str(tmp_path / "dask")],
                                 capsys)
    assert code == 0, err
    local = points_table(tmp_path / "local")
    pd.testing.assert_frame_equal(local, points_table(tmp_path / "procs"))
    pd.testing.assert_frame_equal(local, points_table(tmp_path / "dask"))
    assert "Dask cluster" in (tmp_path / "dask" / "summary.md").read_text()
    assert "2 local processes" in (tmp_path / "procs" / "summary.md").read_text()


def test_trace_driven_points_are_joined_with_measured_quality(tmp_path, capsys):
    trace = write_fixture_trace(tmp_path / "fx")
    code, _, err = sweep_cli(SMALL[:-1] + ["--traces", str(trace), "--cache-dir", str(tmp_path / "c"),
                                           "--out", str(tmp_path / "o")], capsys)
    assert code == 0, err
    trade = pd.read_parquet(tmp_path / "o" / "tradeoff.parquet")
    # 2 devices x (full + h2o/keyformer x 3 ratios) at batch 1, the trace's own model and lengths
    assert len(trade) == 2 * 7 and set(trade["trace"]) == {"fx"}
    assert trade["rouge2"].notna().all() and trade["mass_retained"].notna().all()
    assert trade.groupby("hw")["pareto"].any().all()
    kf = trade[(trade.policy == "keyformer") & (trade.hw == "l4")].sort_values("cache_ratio")
    assert kf["rouge2"].is_monotonic_increasing and kf["max_batch"].is_monotonic_decreasing
    assert (tmp_path / "o" / "pareto_fx.png").stat().st_size > 10_000
    assert "Quality vs throughput" in (tmp_path / "o" / "summary.md").read_text()


def test_trace_options_map_the_trace_onto_other_models_and_lengths(tmp_path, capsys):
    trace = write_fixture_trace(tmp_path / "fx")
    code, _, err = sweep_cli(SMALL + ["--traces", str(trace), "--trace-models", "own,llama-3-8b", "--trace-prompts",
                                      "own,2048", "--trace-gens", "64", "--trace-batches", "1,8", "--no-cache",
                                      "--out", str(tmp_path / "o")], capsys)
    assert code == 0, err
    trade = pd.read_parquet(tmp_path / "o" / "tradeoff.parquet")
    assert set(trade["prompt"]) == {40, 2048} and set(trade["gen"]) == {64} and set(trade["batch"]) == {1, 8}
    assert "llama-3-8b" in set(trade["model"])


def test_des_engine_runs_a_serving_simulation_per_point(tmp_path, capsys, no_traces):
    code, _, err = sweep_cli(["--engine", "des", "--requests", "8", "--hw", "h100-sxm", "--models", "llama-3-8b",
                              "--policies", "full,keyformer", "--cache-ratios", "0.5", "--batches", "4",
                              "--prompts", "512", "--gens", "32", "--no-cache", "--out", str(tmp_path / "o")]
                             + no_traces, capsys)
    assert code == 0, err
    table = points_table(tmp_path / "o")
    assert len(table) == 2 and (table["completed"] == 8).all() and (table["max_in_flight"] <= 4).all()
    assert table["tpot_s_p50"].gt(0).all() and "serving simulation" in (tmp_path / "o" / "summary.md").read_text()


def test_run_options_in_the_yaml_config(tmp_path, capsys):
    cfg = tmp_path / "sweep.yaml"
    cfg.write_text(f"hw: [l4]\nmodels: [gpt2]\npolicies: [full, h2o]\ncache_ratios: [0.5]\nbatches: [1]\n"
                   f"prompts: [128]\ngens: [16]\nworkers: 1\ncache_dir: {tmp_path / 'yc'}\ntraces: none\n")
    code, _, err = sweep_cli(["--config", str(cfg), "--out", str(tmp_path / "o"), "--no-plots"], capsys)
    assert code == 0, err
    assert list((tmp_path / "yc").glob("evaluate-*/shard-*.parquet"))
    assert not (tmp_path / "o" / "tradeoff.parquet").exists()


@pytest.mark.parametrize("argv, fragment", [
    (["--workers", "0"], "--workers"),
    (["--engine", "fpga"], "--engine"),
    (["--traces", "/no/such/trace"], "not found"),
    (["--trace-prompts", "many"], "--trace-prompts"),
    (["--qps", "-1"], "qps"),
])
def test_bad_run_flags_are_one_line_exit_2(argv, fragment, capsys, tmp_path):
    code, out, err = sweep_cli(SMALL + argv + ["--out", str(tmp_path / "x")], capsys)
    assert_one_line_error(code, err, fragment, out=out)
    assert not (tmp_path / "x").exists()


def test_unreachable_scheduler_is_one_line_exit_2(capsys, tmp_path, monkeypatch):
    pytest.importorskip("distributed")
    monkeypatch.setattr(runner.executors, "DASK_CONNECT_TIMEOUT", "1s")
    code, out, err = sweep_cli(SMALL + ["--scheduler", "tcp://127.0.0.1:9", "--out", str(tmp_path / "x")], capsys)
    assert code == 2 and "cannot reach the Dask scheduler" in err and err.count("\n") == 1


def test_interrupted_sweep_resumes_without_recomputing(tmp_path):
    """Ctrl-C in the middle of a DES sweep (slow points): finished points stay in the cache, the rerun
    computes only the rest and the table equals an uninterrupted run's."""
    args = [sys.executable, "-m", "sim.sweep", "--engine", "des", "--requests", "4", "--hw", "l4", "--models",
            "gpt2", "--policies", "full,h2o,keyformer", "--cache-ratios", "0.2,0.4,0.6,0.8,1.0", "--batches", "1,2,4",
            "--prompts", "256", "--gens", "64", "--traces", "none", "--no-plots",
            "--cache-dir", str(tmp_path / "cache")]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen(args + ["--out", str(tmp_path / "a")], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not list((tmp_path / "cache").glob("*/shard-*.parquet")):
        assert time.time() < deadline and proc.poll() is None, proc.stderr.read() if proc.poll() else "no progress"
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and "rerun the same command to resume" in err
    saved = sum(len(pd.read_parquet(p)) for p in (tmp_path / "cache").glob("*/shard-*.parquet"))
    assert 0 < saved < 45
    done = subprocess.run(args + ["--out", str(tmp_path / "b")], cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert f"{saved} from cache" in done.stderr
    fresh = subprocess.run(args[:-2] + ["--no-cache", "--out", str(tmp_path / "c")], cwd=REPO, env=env,
                           capture_output=True, text=True)
    assert fresh.returncode == 0, fresh.stderr
    volatile = ["wall_s"]  # host seconds the simulation took: the only non-deterministic column
    pd.testing.assert_frame_equal(points_table(tmp_path / "b").drop(columns=volatile),
                                  points_table(tmp_path / "c").drop(columns=volatile))


@pytest.mark.slow
def test_benchmark_reports_points_per_second_for_every_mode(tmp_path):
    pytest.importorskip("distributed")
    out = tmp_path / "bench.json"
    done = subprocess.run([sys.executable, "benchmarks/sweep_bench.py", "--points", "20000", "--cache-points", "5000",
                           "--no-progress", "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    import json
    report = json.loads(out.read_text())
    assert report["grid_points"] == 20000
    for mode in ("local", "processes", "dask"):
        run_ = report["runs"][mode]
        assert run_["computed"] == 20000 and run_["points_per_s"] > 0
    assert report["runs"]["cache_warm"]["cached"] == 5000 and report["runs"]["cache_warm"]["computed"] == 0
    assert "load_avg_before" in report["machine"]
