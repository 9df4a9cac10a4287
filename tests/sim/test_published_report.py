"""sim.validation.published_report: intervals on the regime table and what each family's transfer costs."""
from __future__ import annotations

import pandas as pd
import pytest

from sim.validation import published_gpu as pg
from sim.validation import published_report

HAVE_CSV = all(p.is_file() for p in pg.default_csvs())
needs_csv = pytest.mark.skipif(not HAVE_CSV, reason=f"published GPU CSVs not found at {pg.default_csv().parent} "
                               "(set KVSIM_DATA)")


def _table(rows):
    return pd.DataFrame([dict(id=f"r{i}", family=f, regime=g, trained=True, error_pct=e, loso_error_pct=lo)
                         for i, (f, g, e, lo) in enumerate(rows)])


def test_family_transfer_swaps_only_that_familys_rows():
    table = _table([("a", "batch-1", 2.0, -4.0), ("a", "long-context", 1.0, 6.0),
                    ("b", "long-context", -3.0, 30.0), ("b", "batch-1", 7.0, -50.0)])
    out = published_report.family_transfer(table)
    # b at its in-sample error, a at its LOSO error: |-4|, |6|, |-3|, |7|
    assert out["b"] == {"rows": 2, "others_loso_mape": 5.0, "overall_if_in_sample": 5.0,
                        "worst_regime_if_in_sample": "batch-1", "worst_regime_mape_if_in_sample": 5.5}
    # a at its in-sample error, b at its LOSO error: |2|, |1|, |30|, |-50|
    assert out["a"]["others_loso_mape"] == 40.0 and out["a"]["overall_if_in_sample"] == 20.75
    assert out["a"]["worst_regime_if_in_sample"] == "batch-1" and out["a"]["worst_regime_mape_if_in_sample"] == 26.0


def test_family_transfer_ignores_rows_the_fit_never_saw():
    table = _table([("a", "batch-1", 1.0, 2.0), ("b", "batch-1", 1.0, 10.0)])
    table.loc[1, "trained"] = False
    out = published_report.family_transfer(table)
    assert list(out) == ["a"] and out["a"]["overall_if_in_sample"] == 1.0


def test_interval_brackets_the_mape_and_is_seeded():
    df = pd.DataFrame({"source": [f"s{i % 6}" for i in range(30)], "e": [(-1) ** i * (i % 7) for i in range(30)]})
    lo, hi = published_report._interval(df, "e")
    mape = df["e"].abs().mean()
    assert lo < mape < hi and [lo, hi] == published_report._interval(df, "e")
    one = df.assign(source="s")           # one source: nothing to resample, no interval
    assert published_report._interval(one, "e") is None
    assert published_report._with_interval(3.14, None) == "3.1"
    assert published_report._with_interval(3.14, [1.0, 5.25]) == "3.1 [1.0, 5.2]"


@needs_csv
def test_section_carries_intervals_and_the_transfer_table():
    section = published_report.build_section()
    s = section.summary
    for stats in s["regimes"].values():
        for ci, mape in ((stats["loso_ci"], stats["loso_mape"]), (stats["in_sample_ci"], stats["in_sample_mape"])):
            assert ci is None or ci[0] <= mape <= ci[1]     # None: a regime of one source
    overall = s["regimes"]["overall"]
    assert overall["loso_ci"][0] < overall["loso_mape"] < overall["loso_ci"][1]
    transfer = s["family_transfer"]
    assert set(transfer) == set(s["by_family"])
    assert sum(t["rows"] for t in transfer.values()) == s["regimes"]["overall"]["points"]
    for t in transfer.values():     # in sample never worse than out of sample on the whole set, near enough
        assert t["overall_if_in_sample"] <= s["regimes"]["overall"]["loso_mape"] + 1.0
    text = "\n".join(section.markdown)
    assert "What each family's transfer costs" in text and "95% CI" in text
