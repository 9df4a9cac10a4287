"""Sweep figures are copied from the cache when what they show is unchanged (issue 17: a warm rerun
spent most of its time redrawing identical PNGs); any change to the plotted data redraws."""
from __future__ import annotations

import pytest

from sim import plots
from sim.sweep import GridConfig, build_grid, evaluate


@pytest.fixture
def table():
    points = build_grid(GridConfig(hw=["h100-sxm", "l4"], models=["llama-3-8b"], policies=["full", "keyformer"],
                                   cache_ratios=[0.5, 1.0], batches=[1, 8], prompts=[1024], gens=[128]))
    return points.join(evaluate(points))


def test_unchanged_figure_is_copied_not_drawn(table, tmp_path, monkeypatch):
    monkeypatch.setattr(plots, "CACHE_DIR", tmp_path / "cache")
    first = plots.latency_vs_cache_ratio(table, tmp_path / "a.png")
    assert len(list((tmp_path / "cache").glob("*.png"))) == 1

    def no_drawing():
        raise AssertionError("matplotlib was used for an unchanged figure")
    monkeypatch.setattr(plots, "_pyplot", no_drawing)
    second = plots.latency_vs_cache_ratio(table, tmp_path / "b.png")
    assert second.read_bytes() == first.read_bytes()
    changed = table.assign(tpot_s=table["tpot_s"] * 1.01)
    with pytest.raises(AssertionError, match="matplotlib was used"):      # new data: drawn again
        plots.latency_vs_cache_ratio(changed, tmp_path / "c.png")


def test_no_cache_dir_always_draws(table, tmp_path, monkeypatch):
    monkeypatch.setattr(plots, "CACHE_DIR", None)
    calls = []
    real = plots._pyplot
    monkeypatch.setattr(plots, "_pyplot", lambda: calls.append(1) or real())
    plots.throughput_vs_batch(table, tmp_path / "a.png")
    plots.throughput_vs_batch(table, tmp_path / "b.png")
    assert len(calls) == 2 and (tmp_path / "b.png").stat().st_size > 0


def test_keys_cover_data_and_settings(table):
    key = plots.figure_key("x", table, fixed={"batch": 1})
    assert key == plots.figure_key("x", table.copy(), fixed={"batch": 1})
    assert key != plots.figure_key("x", table, fixed={"batch": 8})
    assert key != plots.figure_key("y", table, fixed={"batch": 1})
    assert key != plots.figure_key("x", table.drop(columns=["tpot_s"]), fixed={"batch": 1})
