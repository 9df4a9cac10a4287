"""sim.traced: trace-driven design points, on the synthetic fixture trace (no model, no torch)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("traces")
from sim import engine, runner, sweep, traced  # noqa: E402
from tests.sim.test_tradeoff import FIXTURE_RATIOS, write_fixture_trace  # noqa: E402


@pytest.fixture
def trace_dir(tmp_path):
    return write_fixture_trace(tmp_path / "fx", prompt=40, steps=6)


@pytest.fixture
def config():
    return sweep.GridConfig(hw=["h100-sxm", "l4"], batches=[1, 4])


def test_grid_has_every_captured_policy_and_ratio_at_the_traces_own_lengths(trace_dir, config):
    grid = traced.trace_grid(config, [trace_dir])
    pairs = set(zip(grid["policy_label"], grid["cache_ratio"].round(4)))
    assert pairs == {("full", 1.0)} | {(p, r) for p in ("h2o", "keyformer") for r in FIXTURE_RATIOS}
    assert len(grid) == 2 * 2 * (1 + 2 * len(FIXTURE_RATIOS))   # devices x batches x pairs
    assert set(grid["prompt"]) == {40} and set(grid["gen"]) == {7}  # steps -1..5 -> 7 generated tokens
    assert grid["model"].str.startswith(traced.TRACE_MODEL_PREFIX).all()  # model from the manifest's config
    assert grid["trace_hash"].nunique() == 1 and grid["hw_hash"].nunique() == 2


def test_grid_skips_policies_the_config_excludes(trace_dir, config):
    config.policies = ["full", "keyformer"]
    grid = traced.trace_grid(config, [trace_dir])
    assert set(grid["policy"]) == {"full", "keyformer"}


def test_evaluate_feeds_the_traces_kv_lengths_to_the_engine(trace_dir, config):
    grid = traced.trace_grid(config, [trace_dir], models=["llama-3-8b"], prompts=[2048], gens=[64], batches=[8])
    out = traced.evaluate(grid)
    assert len(out) == len(grid) and list(out.columns) == sweep.OUTPUT_COLUMNS
    row = grid[(grid.policy_label == "keyformer") & np.isclose(grid.cache_ratio, 0.2) & (grid.hw == "h100-sxm")]
    i = row.index[0]
    import traces
    override = traces.load(trace_dir).kv_override("keyformer", 0.2, prompt=2048, gen=64, n_layers=32)
    direct = engine.evaluate("h100-sxm", "llama-3-8b", "keyformer", batch=8, prompt=2048, gen=64, cache_ratio=0.2,
                             kv_override=override)
    assert out.loc[i, "tpot_s"] == pytest.approx(direct["tpot_s"][0])
    assert out.loc[i, "max_batch"] == direct["max_batch"][0]
    # the trace's 20% budget holds fewer tokens than its full cache: faster steps, more sequences fit
    full = out[(grid.policy == "full") & (grid.hw == "h100-sxm")].iloc[0]
    assert out.loc[i, "decode_kv_read_bytes"] < full["decode_kv_read_bytes"]
    assert out.loc[i, "max_batch"] > full["max_batch"]


def test_traced_points_go_through_the_runner_and_a_recaptured_trace_is_recomputed(trace_dir, config, tmp_path):
    grid = traced.trace_grid(config, [trace_dir])
    keys = sweep.cache_key_columns(grid)
    assert "trace_hash" in keys and "trace_path" not in keys and "model" not in keys
    first = runner.run_points(grid, traced.evaluate, key_columns=keys, cache_dir=tmp_path / "c", progress=False)
    again = runner.run_points(grid, traced.evaluate, key_columns=keys, cache_dir=tmp_path / "c", progress=False)
    assert again.n_cached == len(grid) and again.n_computed == 0
    pd.testing.assert_frame_equal(first.table, again.table)
    write_fixture_trace(trace_dir, prompt=40, steps=6, samples=3)  # recaptured with one more sample
    regrid = traced.trace_grid(config, [trace_dir])
    assert runner.run_points(regrid, traced.evaluate, key_columns=keys, cache_dir=tmp_path / "c",
                             progress=False).n_computed == len(regrid)


def test_a_trace_without_a_known_model_is_a_clear_error(tmp_path, config):
    folder = write_fixture_trace(tmp_path / "nomodel", model_name="mystery-model")
    import json
    manifest = json.loads((folder / "manifest.json").read_text())
    del manifest["model"]["config"]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="cannot tell which model"):
        traced.trace_grid(config, [folder])


def test_bundled_traces_are_real_trace_folders():
    import traces
    for path in traces.catalog().traces:     # the one finder the sweep's "bundled" uses
        assert (path / "kv.parquet").exists()


def test_a_warm_sweep_reads_no_trace_table(tmp_path, monkeypatch):
    """trace_grid and the measured quality come from the per-trace records in the cache folder (keyed by the
    trace's content, its quality report and the code version): the second run loads no trace."""
    from sim import traced
    from sim.sweep.grid import GridConfig
    import traces
    folder = traces.catalog().trace("stories260k/tinystories-kept")
    config = GridConfig(hw=["h200-sxm"], models=["llama-2-7b"], policies=["h2o", "window"], cache_ratios=[0.5],
                        batches=[1], prompts=[512], gens=[16])
    identity = traced.trace_identity(folder)
    first = traced.trace_grid(config, [folder], cache_dir=tmp_path)
    quality = traced.trace_quality(folder, identity, tmp_path)
    loads = []
    monkeypatch.setattr(traced, "load_trace", lambda *a, **k: loads.append(a) or pytest.fail("loaded a trace"))
    again = traced.trace_grid(config, [folder], cache_dir=tmp_path)
    pd.testing.assert_frame_equal(first, again)
    pd.testing.assert_frame_equal(quality, traced.trace_quality(folder, identity, tmp_path))
    assert not loads and len(list((tmp_path / "traces").glob("*.json"))) == 2
