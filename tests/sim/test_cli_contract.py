"""The sim CLIs' error contract and outputs as a user types them (issue 27 items 5, 7, 8, 9): one `error:`
line naming the flag and exit 2, nothing half-written, and the two capacities named apart."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from sim import bench, layouts_report, predict, serve
from sim.cli import run
from sim.sweep import main as sweep_main
from tests.helpers import assert_one_line_error

HUGE = "99999999999999999999999"
POINT = ["--hw", "h200-sxm", "--model", "llama-2-7b", "--prompt", "100", "--gen", "10", "--profile", "fused"]
TINY_SWEEP = ["--hw", "h200-sxm", "--models", "llama-2-7b", "--policies", "full,keyformer,h2o", "--cache-ratios",
              "0.2", "--batches", "1", "--prompts", "512", "--gens", "16", "--profiles", "fused", "--traces", "none",
              "--no-cache"]


def _cli(main, argv, capsys):
    code = run(main, argv)
    out, err = capsys.readouterr()
    return code, out, err


def _serve_main(argv):
    from sim.des.cli import main
    return main(argv)


@pytest.mark.parametrize("main, argv, fragment", [
    (sweep_main, ["--prompts", HUGE], "--prompts"),
    (sweep_main, ["--batches", HUGE], "2^53"),
    (_serve_main, POINT[:4] + ["--prompt", HUGE, "--gen", "10", "--requests", "4"], "argument --prompt: expected an integer of at most 2^53"),
    (_serve_main, POINT + ["--requests", HUGE], "argument --requests"),
    (_serve_main, POINT + ["--requests", "4", "--seed", "-1"], "argument --seed"),
    (_serve_main, ["--hw", ""] + POINT[2:] + ["--requests", "4"], "--hw must not be empty"),
    (_serve_main, POINT + ["--requests", "4", "--trace-heads", "max"], "--trace-heads"),
    (_serve_main, POINT + ["--requests", "4", "--prompt-dist", "lognormal:30"], "0 < S <= 3"),
    (predict.main, ["--hw", ""] + POINT[2:], "--hw must not be empty"),
    (predict.main, POINT + ["--trace-heads", "max"], "--trace-heads picks how a trace's KV heads are read: add --trace"),
    (predict.main, POINT + ["--batch", "2", "--pp", "2", "--micro-batches", "8"], "--micro-batches 8 exceeds --batch 2"),
    (bench.main, ["--points", "1e20"], "argument --points: at most"),
    (bench.main, ["--hw", ""], "argument --hw"),
    (bench.main, ["--seed", "-1"], "argument --seed"),
])
def test_mistakes_are_one_line_naming_the_flag(main, argv, fragment, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = _cli(main, argv, capsys)
    assert_one_line_error(code, err, fragment, out=out)
    assert list(tmp_path.iterdir()) == []


def test_bench_reads_points_as_the_help_writes_them():
    assert bench.point_count("1e3") == 1000 and bench.point_count("1_000") == 1000


def test_context_length_zero_in_a_config_is_refused(tmp_path, capsys):
    from sim.models import MODELS_DIR
    config = json.loads((MODELS_DIR / "llama-2-7b.json").read_text())
    config["max_position_embeddings"] = 0
    (tmp_path / "config.json").write_text(json.dumps(config))
    code, out, err = _cli(predict.main, ["--hw", "h200-sxm", "--model", str(tmp_path / "config.json")] + POINT[4:], capsys)
    assert_one_line_error(code, err, "max_position_embeddings", out=out)
    assert "must be a positive integer, got 0" in err


def test_predict_names_static_batch_and_continuous_max_batch_and_json_has_its_tpot(capsys):
    code, out, err = _cli(predict.main, POINT[:4] + ["--prompt", "4096", "--gen", "256", "--batch", "5000",
                                                     "--profile", "fused"], capsys)
    assert code == 0, err
    assert "static batch 5000" in out and "DOES NOT FIT as a static batch of 5000" in out
    assert "requests in flight (continuous batching, steady state)" in out and "as a static batch (all at once)" in out
    code, out, err = _cli(predict.main, POINT + ["--json"], capsys)
    record = json.loads(out)
    assert 0 < record["max_batch_tpot_s"] < 1


def test_serve_prints_memory_in_gib_as_predict_does(capsys):
    code, out, err = _cli(_serve_main, POINT + ["--requests", "4", "--no-progress"], capsys)
    assert code == 0, err
    assert "peak memory (GiB)" in out and "(GB)" not in out


def test_sweep_empty_out_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = _cli(sweep_main, TINY_SWEEP + ["--out", ""], capsys)
    assert_one_line_error(code, err, "--out: empty folder name", out=out)
    assert list(tmp_path.iterdir()) == []


def test_sweep_interrupted_while_plotting_leaves_no_folder_and_says_how_to_resume(tmp_path, capsys, monkeypatch):
    import sim.plots

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(sim.plots, "sweep_plots", interrupted)
    out_dir = tmp_path / "res"
    code, out, err = _cli(sweep_main, TINY_SWEEP + ["--out", str(out_dir)], capsys)
    assert code == 130
    assert f"nothing written to {out_dir}" in err and "rerun the same command to resume" in err
    assert list(tmp_path.iterdir()) == []


def test_sweep_summary_names_the_ratio_it_shows(tmp_path, capsys):
    code, out, err = _cli(sweep_main, TINY_SWEEP + ["--no-plots", "--out", str(tmp_path / "res")], capsys)
    assert code == 0, err
    summary = (tmp_path / "res" / "summary.md").read_text()
    assert "### keyformer vs full, cache ratio 0.2" in summary
    assert "the grid has no cache ratio 0.5, so its nearest, 0.2, is shown" in summary


def test_an_unscored_trace_gets_a_section_not_a_plotting_error(tmp_path):
    from sim.tradeoff import write_tradeoff
    joined = pd.DataFrame({"trace": ["t", "t"], "trace_model": ["m", "m"], "model": ["m", "m"], "hw": ["h", "h"],
                           "policy": ["full", "keyformer(noise=none)"], "cache_ratio": [1.0, 0.5],
                           "max_batch_tokens_per_s": [10.0, 20.0]})
    lines = write_tradeoff(joined, tmp_path, "max_batch_tokens_per_s", plots=False)
    assert any("Not scored" in line for line in lines)
    assert len(pd.read_csv(tmp_path / "tradeoff.csv")) == 2


def test_layouts_report_checks_out_before_reading_traces(tmp_path, capsys, monkeypatch):
    (tmp_path / "file").write_text("x")
    monkeypatch.setattr(layouts_report, "traces_with_kept", lambda *a: pytest.fail("traces read before --out"))
    code, out, err = _cli(layouts_report.main, ["--out", str(tmp_path / "file")], capsys)
    assert_one_line_error(code, err, "is an existing file", out=out)
    code, out, err = _cli(layouts_report.main, ["--out", str(tmp_path / "file" / "x")], capsys)
    assert_one_line_error(code, err, "is a file, not a folder", out=out)


def test_fit_hf_writes_results_unless_the_shipped_file_is_asked_for(tmp_path, capsys, monkeypatch):
    from sim import fit_hf
    from sim.profiles import hf_fit
    from traces.assets import DATA_DIR
    folders = DATA_DIR / "cpu-hf-sdpa"
    if not folders.is_dir():
        pytest.skip("no bundled cpu-hf-sdpa timing folders")
    monkeypatch.chdir(tmp_path)
    shipped = hf_fit.FIT_FILE.stat().st_mtime_ns
    code, out, err = _cli(fit_hf.main, ["--measured", str(folders)], capsys)
    assert code == 0, err
    assert (tmp_path / fit_hf.DEFAULT_OUT).is_file() and str(fit_hf.DEFAULT_OUT) in out
    assert hf_fit.FIT_FILE.stat().st_mtime_ns == shipped
    code, out, err = _cli(fit_hf.main, ["--update-shipped", "--out", "x.yaml"], capsys)
    assert_one_line_error(code, err, "--out and --update-shipped", out=out)
