"""`python -m sim.sweep`: grid building, pure chunkable evaluation, outputs, config files, errors."""
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sim.cli import run
from sim.sweep import INPUT_COLUMNS, OUTPUT_COLUMNS, GridConfig, build_grid, evaluate, main
from tests.helpers import assert_one_line_error
from tests.sim.conftest import real_device_names

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not {"h100-sxm", "l4"} <= set(real_device_names()),
                                reason="hwmodels devices not shipped yet")
SMALL = ["--hw", "h100-sxm,l4", "--models", "llama-3-8b,gpt-j-6b", "--policies", "full,keyformer,window",
         "--cache-ratios", "0.2,0.5,1.0", "--batches", "1,16", "--prompts", "1024", "--gens", "128,512"]


def cli(argv, capsys):
    code = run(main, argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_small_grid_writes_table_plots_and_summary(tmp_path, capsys):
    out_dir = tmp_path / "res"
    code, out, err = cli(SMALL + ["--out", str(out_dir), "--csv"], capsys)
    assert code == 0, err
    assert out.strip() == str(out_dir)
    names = {p.name for p in out_dir.iterdir()}
    assert {"points.parquet", "points.csv", "summary.md", "latency_vs_cache_ratio.png", "throughput_vs_batch.png",
            "max_batch_throughput_vs_cache_ratio.png"} <= names
    assert not any(n.endswith(".tmp") or ".tmp." in n for n in names)
    table = pd.read_parquet(out_dir / "points.parquet")
    assert len(table) == 2 * 2 * 3 * 3 * 2 * 1 * 2
    assert set(INPUT_COLUMNS + OUTPUT_COLUMNS) <= set(table.columns)
    assert table[OUTPUT_COLUMNS].notna().all().drop(["max_batch_tpot_s"]).all()
    csv = pd.read_csv(out_dir / "points.csv")
    assert len(csv) == len(table) and list(csv.columns) == list(table.columns)
    summary = (out_dir / "summary.md").read_text()
    assert "design points" in summary and "keyformer vs full" in summary


def test_evaluate_is_pure_and_chunkable():
    points = build_grid(GridConfig(hw=["h100-sxm", "l4"], models=["llama-3-8b"], batches=[1, 8], prompts=[512, 2048],
                                   gens=[64], cache_ratios=[0.3, 1.0], kv_dtypes=["bf16", "fp8"]))
    whole = evaluate(points)
    assert len(whole) == len(points) and list(whole.columns) == OUTPUT_COLUMNS
    shuffled = points.sample(frac=1.0, random_state=0)
    bounds = np.linspace(0, len(shuffled), 8).astype(int)
    parts = pd.concat([evaluate(shuffled.iloc[a:b]) for a, b in zip(bounds[:-1], bounds[1:])], ignore_index=True)
    expected = whole.iloc[shuffled.index].reset_index(drop=True)
    pd.testing.assert_frame_equal(parts, expected)
    assert {"hw_hash", "model_hash"} <= set(points.columns)


def test_large_groups_evaluated_in_blocks_give_the_whole_groups_numbers(monkeypatch):
    """A group cut into blocks (sim.sweep.analytic.BLOCK_POINTS: its tables stay near the cache) gives the
    numbers of one engine call over the whole group, to the bit, for evicting and growing policies."""
    import sim.sweep.analytic as analytic
    from sim.bench import random_points
    points = random_points(3000, seed=3, devices=["h100-sxm"])
    whole = evaluate(points)
    monkeypatch.setattr(analytic, "BLOCK_POINTS", {"evicting": 37, "growing": 11})
    pd.testing.assert_frame_equal(evaluate(points), whole, check_exact=True)
    cuts = analytic.blocks(5, 105, 30)
    assert [(c.start, c.stop) for c in cuts] == [(5, 38), (38, 72), (72, 105)]
    assert len(analytic.blocks(0, 44, 30)) == 1 and len(analytic.blocks(0, 46, 30)) == 2


def test_decode_bound_column_is_what_pandas_infers_from_the_strings():
    from sim.sweep.analytic import bound_labels
    labels = pd.Series(bound_labels(np.array([True, False, True])))
    expected = pd.Series(["memory", "compute", "memory"])
    pd.testing.assert_series_equal(labels, expected)


def test_default_grid_evaluates_quickly():
    """The default sweep's model evaluation (the part that scales with the grid)."""
    points = build_grid(GridConfig())
    assert len(points) >= 10_000
    assert "cpu" not in " ".join(points["hw"].unique())
    t0 = time.perf_counter()
    evaluate(points)
    assert time.perf_counter() - t0 < 20


@pytest.mark.slow
def test_default_sweep_end_to_end_under_30_s(tmp_path):
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "sim.sweep", "--out", str(tmp_path / "d")], cwd=REPO,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert time.perf_counter() - t0 < 30
    assert (tmp_path / "d" / "points.parquet").exists()


def test_default_output_folder_is_named_and_printed(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, _ = cli(["--hw", "l4", "--models", "gpt2", "--cache-ratios", "0.5", "--batches", "1", "--prompts", "64",
                        "--gens", "8", "--no-plots"], capsys)
    assert code == 0
    folder = Path(out.strip())
    assert folder.parent.name == "results" and folder.name.startswith("sweep-") and (tmp_path / folder).is_dir()


def test_yaml_config_and_flag_override(tmp_path, capsys):
    cfg = tmp_path / "grid.yaml"
    cfg.write_text("devices: [l4]\nmodels: [gpt2, smollm2-135m]\npolicies: [h2o]\ncache_ratios: [0.1, 0.9]\n"
                   "batches: [1]\nprompts: [256]\ngens: [16]\nkv_dtypes: [fp8]\n")
    code, out, err = cli(["--config", str(cfg), "--batches", "2,4", "--out", str(tmp_path / "o"), "--no-plots"], capsys)
    assert code == 0, err
    table = pd.read_parquet(tmp_path / "o" / "points.parquet")
    assert len(table) == 2 * 2 * 2 and set(table["batch"]) == {2, 4} and set(table["kv_dtype"]) == {"fp8"}


@pytest.mark.parametrize("argv, fragment", [
    (["--hw", "no-such-gpu"], "no-such-gpu"),
    (["--models", "llama-9"], "unknown model"),
    (["--policies", "sparse"], "unknown policy"),
    (["--cache-ratios", "0,0.5"], "cache_ratios"),
    (["--cache-ratios", "1.5"], "cache_ratios"),
    (["--batches", "x"], "--batches"),
    (["--batches", "0"], "positive integers"),
    (["--kv-dtypes", "fp7"], "unknown dtype"),
    (["--profiles", "nope"], "unknown profile"),
    (["--config", "/no/such/grid.yaml"], "not found"),
    (["--frobnicate"], "unrecognized arguments"),
])
def test_bad_flags_are_one_line_exit_2(argv, fragment, capsys, tmp_path):
    code, out, err = cli(argv + ["--out", str(tmp_path / "x")], capsys)
    assert_one_line_error(code, err, fragment, out=out)
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("text, fragment", [
    ("models: [gpt2\n", "not valid YAML"),
    ("colours: [red]\n", "unknown key 'colours'"),
    ("- 1\n- 2\n", "expected a mapping"),
    ("batches: []\n", "non-empty list"),
])
def test_bad_config_files(tmp_path, capsys, text, fragment):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(text)
    code, _, err = cli(["--config", str(cfg), "--out", str(tmp_path / "x")], capsys)
    assert code == 2 and fragment in err and err.count("\n") == 1


def test_every_grid_axis_lists_a_design_point_field():
    """The sweep's axis flags are generated from kvcommon.DesignPoint: each GridConfig axis names the field
    it lists (its item type comes from there), and the cache/recent ranges are DesignPoint's."""
    from dataclasses import fields

    from kvcommon import DesignPoint
    from sim.sweep.cli import AXIS_FIELDS, AXIS_HELP, _item_type
    assert set(AXIS_FIELDS) == {f.name for f in fields(GridConfig)} == set(AXIS_HELP)
    assert set(AXIS_FIELDS.values()) <= {f.name for f in fields(DesignPoint)}
    assert (_item_type("cache_ratio"), _item_type("batch"), _item_type("kv_dtype")) == (float, int, str)


def test_workers_give_one_processs_numbers_bit_for_bit(monkeypatch):
    """evaluate(workers=2): the engine calls spread over two forked processes (sim.runner.forked) give the
    single process's outputs exactly, and the same first error."""
    import sim.sweep.analytic as analytic
    from sim.bench import random_points
    from sim.runner.forked import can_fork
    if not can_fork():
        pytest.skip("this platform cannot fork")
    points = random_points(4000, seed=5, devices=["h100-sxm", "l4", "a100-80g-sxm"])
    monkeypatch.setattr(analytic, "BLOCK_POINTS", {"evicting": 150, "growing": 90})
    single = evaluate(points)
    monkeypatch.setattr(analytic, "PARALLEL_MIN_POINTS", 100)
    pd.testing.assert_frame_equal(evaluate(points, workers=2), single, check_exact=True)
    bad = points.copy()
    bad.loc[bad.index[-1], "batch"] = 0                 # one bad point late in the table
    with pytest.raises(ValueError) as serial:
        evaluate(bad)
    with pytest.raises(ValueError) as parallel:
        evaluate(bad, workers=2)
    assert str(parallel.value) == str(serial.value) == "batch must be >= 1"
