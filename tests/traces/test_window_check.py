"""traces.window_check: the budget and recent-window rules re-derived from the manifest, a bundled
full-detail trace clean, and a dropped newest position or an extra one caught."""
from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from traces import reader
from traces import window_check as wc

KEPT_TRACE = Path(__file__).resolve().parents[2] / "traces" / "data" / "smollm2-135m" / "xsum-kept"


def test_rules_paper_and_official():
    # paper: k = floor(0.2 * 461) = 92, w = floor(0.3 * 92) = 27
    assert wc.rules({"recent_ratio": 0.3}, "h2o", 461, 0.2) == (92, 27)
    # official: k = int(461 * 20 / 100) = 92, w = int(92 * 30 / 100) = 27; holds k - 1 and the w - 1 newest
    assert wc.rules({"recent_ratio": 0.3, "selection": "official"}, "keyformer", 461, 0.2) == (91, 26)
    # p = 0.7 at n = 10: floor(0.7 * 10) in float64 is 7 and so is int(10 * 70 / 100); n = 3: 2 and 2
    assert wc.rules({"recent_ratio": 0.0}, "h2o", 3, 0.7) == (2, 0)
    assert wc.rules({"budget_base": "padded"}, "keyformer", 100, 0.5) is None
    assert wc.rules({}, "snapkv", 100, 0.5) is None


@pytest.fixture(scope="module")
def kept_trace():
    return reader.load(KEPT_TRACE)


def test_bundled_trace_is_clean(tmp_path, kept_trace):
    table, skipped = wc.check_trace(kept_trace, samples=4)
    assert set(table["policy"]) == {"h2o", "keyformer", "window"} and table["head_steps"].min() > 0
    assert table["window_violations"].sum() == 0 and table["budget_violations"].sum() == 0
    assert any(s.startswith("snapkv") for s in skipped)
    assert wc.main([str(KEPT_TRACE), "--out", str(tmp_path), "--samples", "2"]) == 0
    assert "| h2o | 0.2 | 2 |" in (tmp_path / "window-check.md").read_text()


def _tampered(kept_trace, change):
    trace = copy.copy(kept_trace)
    trace.__dict__ = dict(kept_trace.__dict__)
    kept = trace.kept.copy()
    row = kept.index[(kept["policy"] == "h2o") & (kept["step"] == 5) & (kept["sample"] == trace.samples[0])][0]
    added, evicted = kept["added"].tolist(), kept["evicted"].tolist()
    i = kept.index.get_loc(row)
    added[i], evicted[i] = change(kept.loc[row])
    kept["added"] = pd.Series(added, index=kept.index, dtype=object)
    kept["evicted"] = pd.Series(evicted, index=kept.index, dtype=object)
    trace.__dict__["kept"] = kept
    table, _ = wc.check_trace(trace, samples=1)
    return table.set_index(["policy", "cache_ratio"]).loc[("h2o", round(float(kept.at[row, "cache_ratio"]), 4))]


def test_a_dropped_newest_position_is_a_window_violation(kept_trace):
    # the step-5 newcomer enters and leaves at once: the head is one short and misses its newest position
    got = _tampered(kept_trace, lambda r: (list(r["added"]), list(r["evicted"]) + list(r["added"])))
    assert got["window_violations"] >= 1 and got["budget_violations"] >= 1


def test_a_missed_eviction_is_a_budget_violation(kept_trace):
    got = _tampered(kept_trace, lambda r: (list(r["added"]), []))
    assert got["budget_violations"] >= 1


def test_bad_input_is_one_line(tmp_path, capsys):
    from kvcommon.cli import run
    assert run(wc.main, [str(tmp_path / "nope")]) == 2
    assert run(wc.main, [str(KEPT_TRACE), "--samples", "0"]) == 2
    assert run(wc.main, [str(KEPT_TRACE), "--samples", "x"]) == 2
    assert all(line.startswith("error:") for line in capsys.readouterr().err.strip().splitlines())
