"""The pre-registered experiment's statistics (traces.decisive.analysis): the sign-flip test, Holm's
correction, effects in % of full, and the plan of comparisons."""
from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from traces.decisive import analysis


def test_sign_flip_is_exact_for_small_samples():
    d = np.array([1.0, 2.0, 3.0, -0.5])
    # all 16 sign patterns: |mean| >= 1.375 for (+,+,+,-) and its mirror, and (+,+,+,+) and its mirror
    patterns = np.array(list(itertools.product((1, -1), repeat=4)))
    expected = np.mean(np.abs(patterns @ d) / 4 >= abs(d.mean()) - 1e-12)
    assert analysis.sign_flip_p(d) == pytest.approx(expected) == pytest.approx(4 / 16)
    assert analysis.sign_flip_p(np.zeros(5)) == 1.0


def test_sign_flip_resolves_a_shift_and_not_noise():
    rng = np.random.default_rng(1)
    assert analysis.sign_flip_p(rng.normal(0.6, 1.0, 100), n_flips=20_000) < 1e-3
    assert analysis.sign_flip_p(rng.normal(0.0, 1.0, 100), n_flips=20_000) > 0.05
    assert analysis.sign_flip_p(rng.normal(0.0, 1.0, 100), n_flips=20_000) >= 1 / 20_001  # never 0


def test_holm_steps_down_and_stays_monotone():
    p = [0.01, 0.04, 0.03, 0.20]
    # sorted 0.01, 0.03, 0.04, 0.20 times 4, 3, 2, 1 -> 0.04, 0.09, 0.09 (monotone), 0.20
    assert analysis.holm(p).tolist() == pytest.approx([0.04, 0.09, 0.09, 0.20])
    assert analysis.holm([0.5, 0.9]).tolist() == [1.0, 1.0]


def test_effect_in_percent_of_full_with_its_interval():
    full = np.full(200, 20.0)
    a = np.full(200, 19.0) + np.tile([0.5, -0.5], 100)
    b = np.full(200, 18.0)
    effect, lo, hi = analysis.pct_of_full(a, b, full, points=False, n_boot=2000)
    assert effect == pytest.approx(5.0) and lo < 5.0 < hi and hi - lo < 1.0
    effect, _, _ = analysis.pct_of_full(np.full(10, 0.9), np.full(10, 0.8), np.ones(10), points=True, n_boot=100)
    assert effect == pytest.approx(10.0)


def _samples(shift: float, n: int = 60) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = []
    for i in range(n):
        base = rng.normal(20.0, 5.0)
        rows.append({"policy": "full", "cache_ratio": 1.0, "sample": f"s{i}", "rouge2": base})
        for r in analysis.RATIOS:
            noise = rng.normal(0.0, 3.0)
            rows.append({"policy": "h2o", "cache_ratio": r, "sample": f"s{i}", "rouge2": base - 4 + noise})
            rows.append({"policy": analysis.H2O_HALF, "cache_ratio": r, "sample": f"s{i}", "rouge2": base - 4})
            rows.append({"policy": analysis.OFFICIAL, "cache_ratio": r, "sample": f"s{i}", "rouge2": base - 4})
            rows.append({"policy": "keyformer", "cache_ratio": r, "sample": f"s{i}",
                         "rouge2": base - 4 + rng.normal(0.0, 3.0) + shift})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("shift", [0.0, 3.0])
def test_evaluate_runs_the_plan_and_says_what_it_rules_out(shift):
    frame = analysis.evaluate({"cnndm": _samples(shift)})
    assert frame["primary"].sum() == 1 and len(frame) == 9  # the CNN/DM part of the plan: 1 + 8
    primary = frame[frame["primary"]].iloc[0]
    assert (primary.metric, primary.cache_ratio, primary.a, primary.b) == ("rouge2", 0.3, "keyformer", "h2o")
    assert primary.n == 60 and bool(primary.significant) == (shift > 0)
    if shift == 0:
        assert primary.pct_lo < 0 < primary.pct_hi
    else:  # +3 ROUGE-2 on a full mean of about 20: about +15% of full
        assert 0 < primary.pct_lo < primary.pct_of_full < primary.pct_hi and 10 < primary.pct_of_full < 20
    assert frame.loc[~frame["primary"], "p_holm"].ge(frame.loc[~frame["primary"], "p"]).all()
    text = analysis.to_markdown(frame)
    assert "ruled out at 95% (60 articles)" in text


def test_the_plan_is_the_preregistered_one():
    comparisons = analysis.plan()
    assert comparisons[0] == analysis.Comparison("cnndm", "rouge2", 0.3, "keyformer", "h2o", primary=True)
    assert sum(c.primary for c in comparisons) == 1 and len(comparisons) == 15  # 1 primary + 14 (Holm)


def test_cli_errors_are_one_line(capsys):
    assert analysis.main.__module__ == "traces.decisive.analysis"
    from kvcommon.cli import run

    assert run(analysis.main, ["--out", "/tmp/x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:")


@pytest.mark.slow
def test_primary_only_runs_the_primary_alone_and_names_the_model(tmp_path, capsys):
    """A subset run (another model, fewer policies) asks for the primary comparison alone: the bundled
    CNN/DM trace's report then has that one row and names SmolLM2-135M."""
    from traces.catalog import DATA_DIR
    from kvcommon.cli import run

    trace = DATA_DIR / "smollm2-135m" / "decisive-cnndm"
    assert run(analysis.main, ["--cnndm", str(trace), "--out", str(tmp_path), "--primary-only"]) == 0
    frame = pd.read_csv(tmp_path / "tests.csv")
    assert len(frame) == 1 and bool(frame["primary"].iloc[0]) and frame["n"].iloc[0] == 100
    assert (tmp_path / "report.md").read_text().startswith("# Keyformer vs H2O: the primary comparison (smollm2-135m)")
