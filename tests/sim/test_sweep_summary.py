"""Sweep outputs (issue 17): the CSV only with --csv (no stale one left), points beyond a model's trained
context marked in the summary and the plot titles, the H2O / Keyformer budgets explained, and "fits only
with eviction" where full attention fits no request."""
from __future__ import annotations

import pandas as pd

from sim import plots
from sim.cli import run
from sim.sweep import FITS_ONLY_WITH_EVICTION, HEADLINE_BUDGETS, main, summary_markdown

# 16k + 4k lies beyond the trained context of both models (llama-2-7b: 4096, llama-3-8b: 8192).
GRID = ["--hw", "l4", "--models", "llama-2-7b,llama-3-8b", "--policies", "full,keyformer,h2o", "--cache-ratios",
        "0.5,0.9", "--batches", "1", "--prompts", "16384", "--gens", "4096", "--traces", "none", "--no-cache"]


def sweep(tmp_path, capsys, *extra):
    out = tmp_path / "res"
    code = run(main, GRID + ["--out", str(out), *extra])
    err = capsys.readouterr().err
    assert code == 0, err
    return out


def test_csv_only_on_request_and_never_stale(tmp_path, capsys):
    out = sweep(tmp_path, capsys, "--no-plots", "--csv")
    assert (out / "points.csv").is_file() and (out / "points.parquet").is_file()
    assert len(pd.read_csv(out / "points.csv")) == len(pd.read_parquet(out / "points.parquet"))
    out = sweep(tmp_path, capsys, "--no-plots")
    assert not (out / "points.csv").exists() and (out / "points.parquet").is_file()


def test_summary_marks_context_explains_budgets_and_says_fits_only_with_eviction(tmp_path, capsys):
    out = sweep(tmp_path, capsys, "--no-plots")
    summary = (out / "summary.md").read_text()
    for _policy, _ratio, why in HEADLINE_BUDGETS:
        assert f"Why this ratio: {why}." in summary
    kf = summary.split("### keyformer vs full")[1].split("###")[0]
    row = next(line for line in kf.splitlines() if line.startswith("| l4 | llama-2-7b |"))
    assert row.rstrip().endswith("| yes (trained 4096) |")
    assert "prompt 16384 + gen 4096 lies beyond the trained context of llama-2-7b, llama-3-8b" in summary
    table = pd.read_parquet(out / "points.parquet")
    assert table["exceeds_max_positions"].all()
    # where full attention fits no request (its max-batch throughput 0) the gain is words, never NaN
    table.loc[(table["policy"] == "full") & (table["model"] == "llama-2-7b"), "max_batch_tokens_per_s"] = 0.0
    table.loc[table["model"] == "llama-3-8b", "max_batch_tokens_per_s"] = 0.0
    text = summary_markdown(table, {})
    kf = text.split("### keyformer vs full")[1].split("###")[0]
    rows = {line.split("|")[2].strip(): [c.strip() for c in line.strip().strip("|").split("|")]
            for line in kf.splitlines() if line.startswith("| l4 |")}
    assert rows["llama-2-7b"][-2] == FITS_ONLY_WITH_EVICTION and rows["llama-3-8b"][-2] == "fits neither"
    assert "nan" not in kf.lower()
    assert f'"{FITS_ONLY_WITH_EVICTION}": full attention does not fit one request' in text


def test_plot_titles_mark_a_slice_beyond_context():
    t = pd.DataFrame({"exceeds_max_positions": [True, True]})
    assert "BEYOND the model's trained context" in plots.context_note(t)
    assert "partly" in plots.context_note(pd.DataFrame({"exceeds_max_positions": [True, False]}))
    assert plots.context_note(pd.DataFrame({"exceeds_max_positions": [False]})) == ""
