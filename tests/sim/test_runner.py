"""sim.runner: per-point cache keys, resume after interruption, and the three executors agree."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sim import runner
from sim.runner import DaskExecutor, LocalExecutor, ProcessExecutor, ResultCache, point_keys, run_points

REPO = Path(__file__).resolve().parents[2]


# A toy "simulator": pure, vectorised, and it logs which points it evaluated (through an env var, so
# worker processes log too) so the tests can prove that nothing is computed twice.
def toy_evaluate(chunk: pd.DataFrame) -> pd.DataFrame:
    delay = float(os.environ.get("KVSIM_TOY_DELAY", "0"))
    if delay:
        time.sleep(delay)
    fail_on = os.environ.get("KVSIM_TOY_FAIL_ON")
    if fail_on is not None and int(fail_on) in set(chunk["pid"]):
        raise RuntimeError("toy failure")
    log = os.environ.get("KVSIM_TOY_LOG")
    if log:
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        os.write(fd, ("\n".join(map(str, chunk["pid"])) + "\n").encode())
        os.close(fd)
    return pd.DataFrame({"pid": chunk["pid"].to_numpy(),
                         "latency_s": chunk["batch"] * chunk["ratio"] + chunk["device_hash"].str.len()})


def wrong_length_evaluate(chunk: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"y": [1.0]})


def grid(n: int = 400) -> pd.DataFrame:
    i = np.arange(n)
    return pd.DataFrame({"pid": i, "batch": 1 + i % 8, "ratio": np.round(0.1 + (i // 8) % 10 * 0.1, 10),
                         "device": np.where(i % 2, "h100", "a100"),
                         "device_hash": np.where(i % 2, "hash-h100-v1", "hash-a100-v1")})


def logged(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()] if path.exists() else []


@pytest.fixture
def toy_env(tmp_path, monkeypatch):
    log = tmp_path / "computed.log"
    monkeypatch.setenv("KVSIM_TOY_LOG", str(log))
    monkeypatch.delenv("KVSIM_TOY_FAIL_ON", raising=False)
    monkeypatch.delenv("KVSIM_TOY_DELAY", raising=False)
    return log


# ------------------------------------------------------------------------------------------ keys

def test_keys_identify_the_configuration_not_its_spelling():
    a = pd.DataFrame({"batch": [1, 2], "ratio": [0.1 + 0.2, 0.5], "device": ["h100", "h100"]})
    b = pd.DataFrame({"device": ["h100", "h100"], "ratio": [0.3, 0.5], "batch": [1.0, 2.0]})
    ka, kb = point_keys(a, a.columns, "s"), point_keys(b, b.columns, "s")
    assert np.array_equal(ka[0], kb[0]) and np.array_equal(ka[1], kb[1])


def test_keys_change_with_any_key_column_and_with_the_salt():
    base = pd.DataFrame({"batch": [1], "ratio": [0.5], "device_hash": ["v1"]})
    key = point_keys(base, base.columns, "s")[0][0]
    for column, value in [("batch", 2), ("ratio", 0.500001), ("device_hash", "v2")]:
        changed = base.assign(**{column: [value]})
        assert point_keys(changed, changed.columns, "s")[0][0] != key, column
    assert point_keys(base, base.columns, "other code version")[0][0] != key


def test_key_columns_must_exist():
    with pytest.raises(ValueError, match="not columns"):
        point_keys(grid(3), ["nope"], "s")


def test_code_version_is_a_stable_hash_of_the_sources():
    assert runner.code_version() == runner.code_version()
    assert len(runner.code_version()) == 16


# ------------------------------------------------------------------------------ cache and resume

def test_local_run_matches_direct_evaluation_in_input_order(toy_env):
    points = grid().sample(frac=1.0, random_state=0)
    result = run_points(points, toy_evaluate, progress=False, chunk_size=37)
    expected = toy_evaluate(points.reset_index(drop=True))
    pd.testing.assert_frame_equal(result.table, expected)
    assert result.n_computed == len(points) and result.n_cached == 0


def test_rerun_is_served_from_the_cache_and_new_points_only_are_computed(toy_env, tmp_path):
    cache = tmp_path / "cache"
    first = run_points(grid(200), toy_evaluate, cache_dir=cache, progress=False)
    second = run_points(grid(200), toy_evaluate, cache_dir=cache, progress=False)
    assert (second.n_cached, second.n_computed) == (200, 0)
    pd.testing.assert_frame_equal(first.table, second.table)
    bigger = run_points(grid(300), toy_evaluate, cache_dir=cache, progress=False)
    assert (bigger.n_cached, bigger.n_computed) == (200, 100)
    assert sorted(logged(toy_env)) == list(range(300))  # every point exactly once over three runs
    pd.testing.assert_frame_equal(bigger.table, toy_evaluate(grid(300)))


def test_editing_one_device_file_recomputes_only_its_points(toy_env, tmp_path):
    cache = tmp_path / "cache"
    points = grid(100)
    run_points(points, toy_evaluate, cache_dir=cache, progress=False)
    edited = points.assign(device_hash=np.where(points.device == "h100", "hash-h100-v2", points.device_hash))
    again = run_points(edited, toy_evaluate, cache_dir=cache, progress=False)
    assert again.n_computed == int((points.device == "h100").sum()) == 50


def test_context_or_code_change_starts_a_fresh_namespace(toy_env, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    run_points(grid(50), toy_evaluate, cache_dir=cache, progress=False, context={"engine": "analytic"})
    other = run_points(grid(50), toy_evaluate, cache_dir=cache, progress=False, context={"engine": "des"})
    assert other.n_computed == 50
    monkeypatch.setattr(runner, "code_version", lambda *a: "edited-sources")
    assert run_points(grid(50), toy_evaluate, cache_dir=cache, progress=False,
                      context={"engine": "des"}).n_computed == 50


def test_duplicate_points_are_computed_once(toy_env, tmp_path):
    points = pd.concat([grid(60), grid(60)], ignore_index=True)
    result = run_points(points, toy_evaluate, cache_dir=tmp_path / "c", progress=False)
    assert result.n_computed == 60 and sorted(logged(toy_env)) == list(range(60))
    pd.testing.assert_frame_equal(result.table, toy_evaluate(points))


def test_failure_mid_sweep_keeps_finished_chunks_and_resume_computes_the_rest_once(toy_env, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("KVSIM_TOY_FAIL_ON", "250")
    with pytest.raises(RuntimeError, match="toy failure"):
        run_points(grid(400), toy_evaluate, cache_dir=cache, progress=False, chunk_size=50)
    assert sorted(logged(toy_env)) == list(range(250 // 50 * 50))  # chunks 0..4 finished and saved
    monkeypatch.delenv("KVSIM_TOY_FAIL_ON")
    resumed = run_points(grid(400), toy_evaluate, cache_dir=cache, progress=False, chunk_size=50)
    assert (resumed.n_cached, resumed.n_computed) == (250, 150)
    assert sorted(logged(toy_env)) == list(range(400))
    pd.testing.assert_frame_equal(resumed.table, toy_evaluate(grid(400)))


SWEEP_SCRIPT = textwrap.dedent("""
    import sys
    from sim import runner
    # Other work may edit the sources while this test runs; pin the code version both sides use.
    runner.code_version = lambda *a: "pinned-for-test"
    from sim.runner import run_points, make_executor
    from tests.sim.test_runner import grid, toy_evaluate
    workers = int(sys.argv[2])
    run_points(grid(int(sys.argv[3])), toy_evaluate, cache_dir=sys.argv[1], chunk_size=int(sys.argv[4]),
               executor=make_executor(workers), progress=False)
    print("finished")
""")


def _start_sweep(cache: Path, workers: int, n: int, chunk: int, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", SWEEP_SCRIPT, str(cache), str(workers), str(n), str(chunk)],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_lines(log: Path, count: int, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while len(logged(log)) < count:
        assert time.time() < deadline, "sweep made no progress"
        time.sleep(0.02)


@pytest.fixture
def pinned_code_version(monkeypatch):
    monkeypatch.setattr(runner, "code_version", lambda *a: "pinned-for-test")


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGINT], ids=["SIGKILL", "SIGINT"])
def test_killed_sweep_resumes_with_nothing_lost_and_nothing_computed_twice(toy_env, tmp_path, how,
                                                                           pinned_code_version):
    cache = tmp_path / "cache"
    env = dict(os.environ, KVSIM_TOY_DELAY="0.05", PYTHONPATH=str(REPO))
    proc = _start_sweep(cache, 1, 600, 20, env)
    _wait_for_lines(toy_env, 100)
    proc.send_signal(how)
    proc.wait(timeout=30)
    assert proc.returncode != 0
    saved = sum(len(pd.read_parquet(p)) for p in cache.rglob("shard-*.parquet"))
    before = logged(toy_env)
    assert saved >= 100 - 20  # all finished chunks but at most the one being written
    assert len(before) - saved <= 20  # lost at most the chunk in flight
    resumed = run_points(grid(600), toy_evaluate, cache_dir=cache, progress=False, chunk_size=20)
    assert resumed.n_cached == saved and resumed.n_computed == 600 - saved
    counts = pd.Series(logged(toy_env)).value_counts()
    assert set(counts.index) == set(range(600))
    assert (counts > 1).sum() <= 20  # only points of the one interrupted chunk ran twice
    pd.testing.assert_frame_equal(resumed.table, toy_evaluate(grid(600)))


def test_ctrl_c_stops_worker_processes_promptly_and_keeps_their_finished_chunks(toy_env, tmp_path,
                                                                                 pinned_code_version):
    cache = tmp_path / "cache"
    env = dict(os.environ, KVSIM_TOY_DELAY="0.1", PYTHONPATH=str(REPO))
    proc = _start_sweep(cache, 2, 2000, 10, env)
    _wait_for_lines(toy_env, 60)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=15)
    assert proc.returncode != 0 and "finished" not in proc.stdout.read()
    saved = sum(len(pd.read_parquet(p)) for p in cache.rglob("shard-*.parquet"))
    computed = len(logged(toy_env))
    # Each of the 2 workers may lose the one chunk (10 points) it was computing; nothing finished is lost.
    assert computed >= 60 and computed - saved <= 2 * 10
    resumed = run_points(grid(2000), toy_evaluate, cache_dir=cache, progress=False)
    assert resumed.n_cached == saved


def test_wrong_row_count_from_evaluate_is_an_error(tmp_path):
    with pytest.raises(RuntimeError, match="returned 1 rows for 10 points"):
        run_points(grid(10), wrong_length_evaluate, progress=False, chunk_size=10)


def test_unreadable_shard_is_ignored_with_a_warning_and_its_points_recomputed(toy_env, tmp_path):
    cache = tmp_path / "cache"
    run_points(grid(40), toy_evaluate, cache_dir=cache, progress=False, chunk_size=20)
    shard = sorted(cache.rglob("shard-*.parquet"))[0]
    shard.write_bytes(b"not parquet")
    with pytest.warns(UserWarning, match="unreadable cache shard"):
        again = run_points(grid(40), toy_evaluate, cache_dir=cache, progress=False, chunk_size=20)
    assert again.n_computed == 20
    # issue 17: the recomputed points replace the corrupt shard, so the next run neither warns nor recomputes
    assert not shard.exists() and len(list(cache.rglob("shard-*.parquet"))) == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        third = run_points(grid(40), toy_evaluate, cache_dir=cache, progress=False, chunk_size=20)
    assert third.n_cached == 40 and third.n_computed == 0
    pd.testing.assert_frame_equal(third.table, again.table)


def test_compaction_skips_an_unreadable_shard(toy_env, tmp_path):
    cache = tmp_path / "cache"
    run_points(grid(630), toy_evaluate, cache_dir=cache, progress=False, chunk_size=10)   # 63 shards
    shard = sorted(cache.rglob("shard-*.parquet"))[0]
    shard.write_bytes(b"not parquet")
    with pytest.warns(UserWarning, match="unreadable cache shard"):
        again = run_points(grid(640), toy_evaluate, cache_dir=cache, progress=False, chunk_size=10)
    assert again.n_computed == 20 and len(again.table) == 640
    assert [p.name for p in cache.rglob("shard-*.parquet")] != [] and not shard.exists()
    assert run_points(grid(640), toy_evaluate, cache_dir=cache, progress=False).n_cached == 640


def test_many_shards_are_compacted_without_losing_points(toy_env, tmp_path):
    cache = tmp_path / "cache"
    run_points(grid(700), toy_evaluate, cache_dir=cache, progress=False, chunk_size=10)  # 70 shards
    assert len(list(cache.rglob("shard-*.parquet"))) == 1
    again = run_points(grid(700), toy_evaluate, cache_dir=cache, progress=False)
    assert again.n_cached == 700


def test_progress_bar_shows_points_rate_and_time_left(toy_env, capsys, monkeypatch):
    monkeypatch.setenv("KVSIM_PROGRESS", "1")     # bars only on a terminal unless forced (capsys is none)
    run_points(grid(100), toy_evaluate, chunk_size=10, desc="toy")
    err = capsys.readouterr().err
    assert "toy" in err and "100/100" in err and "pt/s" in err and "<" in err


# ------------------------------------------------------------------------------------ executors

def test_local_processes_give_the_same_table(toy_env, tmp_path):
    points = grid(300)
    result = run_points(points, toy_evaluate, executor=ProcessExecutor(2), cache_dir=tmp_path / "c",
                        progress=False, chunk_size=25)
    assert sorted(logged(toy_env)) == list(range(300))
    pd.testing.assert_frame_equal(result.table, toy_evaluate(points))
    assert result.executor == "2 local processes"


def test_workers_must_be_positive():
    with pytest.raises(ValueError, match="workers must be >= 1"):
        ProcessExecutor(0)


def test_dask_cluster_gives_the_same_table_and_shares_the_cache(toy_env, tmp_path):
    distributed = pytest.importorskip("distributed")
    cache = tmp_path / "c"
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster:
        executor = DaskExecutor(cluster.scheduler_address)
        try:
            result = run_points(grid(300), toy_evaluate, executor=executor, cache_dir=cache,
                                progress=False, chunk_size=7)  # 43 chunks through a window of 4
            assert "Dask cluster" in result.executor
        finally:
            executor.close()
    pd.testing.assert_frame_equal(result.table, toy_evaluate(grid(300)))
    local = run_points(grid(300), toy_evaluate, executor=LocalExecutor(), cache_dir=cache, progress=False)
    assert local.n_cached == 300  # a local rerun reuses what the cluster computed


def test_unreachable_scheduler_is_a_clear_error():
    pytest.importorskip("distributed")
    with pytest.raises(ValueError, match="cannot reach the Dask scheduler"):
        DaskExecutor("tcp://127.0.0.1:9", connect_timeout="1s")


def test_shards_are_written_atomically(tmp_path, monkeypatch):
    cache = ResultCache(tmp_path, "ns")
    calls = []
    real_replace = os.replace
    monkeypatch.setattr(runner.os, "replace", lambda a, b: (calls.append((Path(a).name, Path(b).name)),
                                                           real_replace(a, b)))
    cache.store(np.array([1], np.uint64), np.array([2], np.uint64), pd.DataFrame({"y": [3.0]}))
    (tmp_name, final_name), = calls
    assert tmp_name == final_name + ".tmp"
    assert cache.load()["y"].tolist() == [3.0]
