"""traces.decisive.beams: the beam-4 subset end to end on a tiny random Llama (2 articles, 2 beams)."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from traces.decisive import beams


def _argv(out, dataset, *extra):
    return ["--out", str(out), "--model", "tiny-llama", "--dataset", f"jsonl:{dataset}", "--n", "2", "--beams", "2",
            "--max-new-tokens", "4", "--max-prompt-tokens", "48", "--cache-ratios", "0.5", *extra]


def test_beam_subset_writes_every_run_and_resumes(tmp_path, tiny_dataset, capsys):
    pytest.importorskip("torch")
    out = tmp_path / "beam"
    assert beams.main(_argv(out, tiny_dataset)) == 0
    frame = pd.read_csv(out / "beams.csv")
    # full once at 1.0, h2o and keyformer-official at 0.5: 3 runs per article
    assert len(frame) == 6 and set(frame["cache_ratio"]) == {1.0, 0.5}
    assert set(frame["policy"]) == {"full", "h2o", "keyformer(beam_noise=summed,selection=official)"}
    assert (frame["beams"] == 2).all() and frame["rouge2"].between(0, 100).all()
    assert (frame["n_generated"] <= 4).all()
    report = (out / "report.md").read_text()
    assert "keyformer(beam_noise=summed,selection=official) - h2o" in report and "| 2 |" in report
    # a resumed run redoes nothing: the shards stay as they were
    shard = next((out / beams.SHARDS).glob("h2o*"))
    before = shard.read_text()
    assert beams.main(_argv(out, tiny_dataset)) == 0
    assert shard.read_text() == before and json.loads(before)["policy"] == "h2o"


def test_parts_split_the_runs_and_the_last_writes_the_report(tmp_path, tiny_dataset, capsys):
    pytest.importorskip("torch")
    out = tmp_path / "beam"
    assert beams.main(_argv(out, tiny_dataset, "--part", "1/2")) == 0
    assert len(list((out / beams.SHARDS).glob("*.json"))) == 3 and not (out / "report.md").exists()
    assert "3 runs of other parts still missing" in capsys.readouterr().err
    assert beams.main(_argv(out, tiny_dataset, "--part", "2/2")) == 0
    assert len(pd.read_csv(out / "beams.csv")) == 6 and (out / "report.md").exists()


def test_beam_noise_is_the_released_codes_four_draw_sum(tmp_path, tiny_dataset):
    pytest.importorskip("torch")
    out = tmp_path / "beam"
    assert beams.main(_argv(out, tiny_dataset, "--policies", "full,h2o,keyformer:selection=official,beam_noise=summed")) == 0
    row = json.loads(next((out / beams.SHARDS).glob("keyformer*")).read_text())
    assert row["beams"] == 2 and "generated" in row


@pytest.mark.parametrize("flags, message", [
    (["--policies", "full,keyformer"], "needs full, h2o"),
    (["--cache-ratios", "0,0.5"], "cache-ratios"),
    (["--policies", "full,h2o,keyformer:nonsense=1"], "nonsense"),
    (["--part", "3/2"], "--part"),
    (["--part", "half"], "--part"),
])
def test_bad_flags_are_one_line_errors(tmp_path, tiny_dataset, capsys, flags, message):
    from kvcommon.cli import run
    assert run(beams.main, _argv(tmp_path / "b", tiny_dataset, *flags)) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and message in err


def test_the_committed_beam4_result_is_whole_and_its_report_reads_off_it():
    """traces/data/smollm2-135m/decisive-beam4: every planned run (50 articles x full + H2O and Keyformer
    official at 0.2/0.3/0.5), 4 beams, SmolLM2-135M-Instruct; the report's means are the CSV's."""
    from pathlib import Path
    folder = Path(__file__).resolve().parents[2] / "traces" / "data" / "smollm2-135m" / "decisive-beam4"
    frame = pd.read_csv(folder / "beams.csv")
    assert len(frame) == 350 and frame["sample"].nunique() == 50
    assert (frame["beams"] == 4).all() and set(frame["model"]) == {"smollm2-135m"}
    counts = frame.groupby(["policy", "cache_ratio"]).size()
    assert len(counts) == 7 and (counts == 50).all()
    report = (folder / "report.md").read_text()
    for (policy, ratio), mean in frame.groupby(["policy", "cache_ratio"])["rouge2"].mean().items():
        assert f"| {policy} | {ratio:g} | " in report and f" | {mean:.2f} | " in report
