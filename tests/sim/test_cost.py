"""sim.cost: cost per million output tokens from throughput and an hourly price."""
import math

import pytest

from hwmodels.platform import default_price
from sim import cost, engine, parallel


def test_formula():
    assert cost.cost_per_mtok(1000.0, 3.6) == pytest.approx(1.0)       # 3.6 $/h = 1e-3 $/s; 1e6 tokens take 1000 s
    assert cost.cost_per_mtok(1000.0, 3.6, devices=8) == pytest.approx(8.0)
    assert cost.cost_per_mtok(2000.0, 3.6) == pytest.approx(0.5)
    assert cost.cost_per_mtok(0.0, 3.6) == math.inf
    with pytest.raises(ValueError):
        cost.cost_per_mtok(1.0, -1.0)


def test_default_price_and_override():
    usd, source = cost.price_per_hour("h100-sxm")
    assert usd == default_price("h100-sxm").usd_per_hour and default_price("h100-sxm").date in source
    assert cost.price_per_hour("h100-sxm", 1.5) == (1.5, "command line")
    assert cost.price_per_hour("cpu-local")[0] is None
    with pytest.raises(ValueError, match="price-per-hour"):
        cost.price_per_hour("h100-sxm", float("nan"))


def test_summary_counts_every_device_and_the_largest_batch_is_cheaper():
    p = engine.predict("h100-sxm", "llama-3-8b", 1, 2048, 256, "full", 1.0)
    s = cost.cost_summary(p)
    assert s["cost_per_mtok"] == pytest.approx(cost.cost_per_mtok(p.tokens_per_s, s["price_usd_per_hour"]))
    assert s["cost_per_mtok_at_max_batch"] < s["cost_per_mtok"]
    two = parallel.predict("h100-sxm", "llama-3-8b", 1, 2048, 256, "full", 1.0, tp=2)
    s2 = cost.cost_summary(two, override=2.0)
    assert s2["devices"] == 2 and s2["cost_per_mtok"] == pytest.approx(2 * 2.0 / 3600 * 1e6 / two.tokens_per_s)
    none = cost.cost_summary(engine.predict("cpu-local", "gpt2", 1, 64, 8, "full", 1.0, weight_dtype="fp32",
                                            kv_dtype="fp32"))
    assert none["cost_per_mtok"] is None and "no price" in none["price_source"]
