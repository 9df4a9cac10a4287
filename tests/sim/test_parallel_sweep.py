"""sim.parallel.sweep: the sweep's columns for tp x pp points, and energy and cost columns."""
import numpy as np
import pytest

from sim.parallel import sweep as ps
from sim.sweep.analytic import evaluate as analytic
from sim.sweep.grid import GridConfig, build_grid


@pytest.fixture(scope="module")
def points():
    return build_grid(GridConfig(hw=["h100-sxm", "cpu-local"], models=["smollm2-135m"], policies=["full", "window"],
                                 cache_ratios=[0.2, 1.0], batches=[1, 4], prompts=[512], gens=[32]))


def test_one_device_columns_equal_the_analytic_sweep(points):
    a, b = analytic(points), ps.evaluate(points)
    for col in a.columns:
        x, y = a[col].to_numpy(), b[col].to_numpy()
        assert (x == y).all() or np.allclose(x.astype(float), y.astype(float), rtol=0, atol=0, equal_nan=True), col
    assert (b["devices"] == 1).all()


def test_tp_points_carry_the_parallel_columns(points):
    gpu = points[points.hw == "h100-sxm"].assign(tp=3)        # smollm2: 9 heads, 3 KV heads
    out = ps.evaluate(gpu)
    assert (out["devices"] == 3).all() and (out["comm_decode_s"] > 0).all() and (out["interconnect"] == "nvlink4").all()
    one = ps.evaluate(points[points.hw == "h100-sxm"])
    assert (out["weight_bytes_per_device"].to_numpy() < one["weight_bytes_per_device"].to_numpy()).all()


def test_energy_columns(points):
    e = ps.energy_columns(points)
    assert list(e.columns) == ps.ENERGY_COLUMNS and len(e) == len(points)
    gpu, cpu = (points.hw == "h100-sxm").to_numpy(), (points.hw == "cpu-local").to_numpy()
    assert e.loc[gpu, "energy_j_per_token"].gt(0).all() and e.loc[cpu, "energy_j_per_token"].isna().all()
    parts = e.loc[gpu, [f"decode_{p}_j_per_token" for p in ("weights", "kv", "activations", "compute", "comm", "static")]]
    assert np.allclose(parts.sum(axis=1), e.loc[gpu, "energy_j_per_token"])
    priced = ps.energy_columns(points, price=1.0)
    assert (priced.loc[cpu, "price_usd_per_hour"] == 1.0).all()
