"""Users' benchmark outputs (vLLM, SGLang, TensorRT-LLM) read as measured runs and replayed in the DES
through `sim.validate --measured-run`, as a user types it; bad files are one-line errors that write nothing."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from sim.cli import run
from sim.validate import main as validate_main
from sim.validation.measured_run import load_measured_runs
from sim.validation.measured_run_replay import fit_items, replay_requests
from tests.helpers import assert_one_line_error

DATA = Path(__file__).parent / "data" / "measured_runs"
VLLM, SGLANG, TRT = DATA / "vllm_serve.json", DATA / "sglang_bench.jsonl", DATA / "trtllm_report.json"


def validate(capsys, *argv):
    code = run(validate_main, [str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_vllm_result_reads_in_seconds_with_its_requests():
    (r,) = load_measured_runs(VLLM)
    assert r.tool == "vllm" and r.model == "meta-llama/Llama-3.1-8B-Instruct" and r.requests == 8
    assert math.isinf(r.request_rate) and r.max_concurrency == 4 and r.per_request
    assert r.prompt_lens.tolist()[:3] == [512, 1024, 256] and r.output_lens.tolist()[-1] == 150
    assert r.metrics["ttft_s_p99"] == pytest.approx(0.0924) and r.metrics["tpot_s_p50"] == pytest.approx(0.0105)
    assert r.metrics["e2e_s_mean"] == pytest.approx(1.44) and r.metrics["tokens_per_s"] == pytest.approx(228.1)


def test_sglang_jsonl_gives_one_run_per_line_with_mean_lengths():
    runs = load_measured_runs(SGLANG)
    assert [r.request_rate for r in runs] == [2.0, 8.0] and all(r.model is None for r in runs)
    assert runs[0].source.endswith("sglang_bench.jsonl:1") and not runs[0].per_request
    assert runs[0].mean_prompt == 1024 and runs[0].mean_output == 128
    assert runs[1].metrics["ttft_s_mean"] == pytest.approx(0.061) and "e2e_s_mean" in runs[1].metrics


def test_trtllm_report_reads_its_sections():
    (r,) = load_measured_runs(TRT)
    assert r.tool == "trtllm" and r.engine == "trtllm-pytorch" and r.tp == 1 and r.max_concurrency == 64
    assert r.metrics["ttft_s_p99"] == pytest.approx(0.861) and r.metrics["requests_per_s"] == 20.6
    assert r.mean_prompt == 1024 and any("average" in n for n in r.notes)


def test_replay_keeps_lengths_and_arrival_pattern():
    (r,) = load_measured_runs(VLLM)
    trace = replay_requests(r)
    assert trace.prompt_tokens.tolist() == r.prompt_lens.tolist() and not trace.arrival_s.any()
    rate = load_measured_runs(SGLANG)[1]
    trace = replay_requests(rate)
    assert len(trace) == 100 and (trace.prompt_tokens == 1024).all()
    assert (len(trace) - 1) / trace.arrival_s[-1] == pytest.approx(8.0, rel=0.3)    # Poisson at the client's rate


def test_validate_measured_run_reports_every_metric(tmp_path, capsys):
    out_dir = tmp_path / "report"
    code, out, err = validate(capsys, "--measured-run", VLLM, SGLANG, "--hw", "h100-sxm", "--model", "llama-3.1-8b",
                              "--out", out_dir, "--json")
    assert code == 0, err
    summary = json.loads(out)
    assert len(summary["runs"]) == 3
    first = summary["runs"][0]
    assert first["tool"] == "vllm" and first["profile"] == "vllm" and first["max_concurrency"] == 4
    rows = {row["metric"]: row for row in first["metrics"]}
    assert set(rows) >= {"ttft_s_p99", "tpot_s_p50", "itl_s_mean", "e2e_s_mean", "requests_per_s"}
    for row in rows.values():
        assert row["simulated"] > 0
        assert row["error_pct"] == pytest.approx(100 * (row["simulated"] - row["measured"]) / row["measured"])
    assert summary["runs"][1]["profile"] == "vllm"          # SGLang: no profile of its own
    report = (out_dir / "measured-runs.md").read_text()
    assert "sglang_bench.jsonl:2" in report and "| ttft_s_p99 |" in report
    assert json.loads((out_dir / "measured-runs.json").read_text())["runs"][2]["request_rate"] == 8.0


def test_trtllm_report_names_its_model(tmp_path, capsys):
    code, out, err = validate(capsys, "--measured-run", TRT, "--hw", "h100-sxm", "--out", tmp_path / "r")
    assert code == 0, err
    assert "trtllm (trtllm-pytorch) meta-llama/Llama-3.1-8B: 200 requests" in out


@pytest.mark.parametrize("content,fragment", [
    ({"results": [1, 2]}, "not a benchmark result kvsim reads (found results)"),
    ({"date": "x", "model_id": "m", "tokenizer_id": "m", "duration": 3.0, "completed": 0}, "completed must be"),
    ({"engine": {}, "world_info": {}, "performance": {"request_throughput_req_s": 1.0}}, "'request_info' section"),
    ({"backend": "sglang", "dataset_name": "random", "random_input_len": 8, "duration": 1.0, "completed": 5,
      "request_rate": "trace", "mean_ttft_ms": 1.0}, "request_rate 'trace'"),
    ("not json at all\n", "not JSON"),
])
def test_other_files_are_one_line_errors_naming_what_was_expected(tmp_path, capsys, content, fragment):
    path = tmp_path / "bench.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    out_dir = tmp_path / "report"
    code, out, err = validate(capsys, "--measured-run", path, "--hw", "h100-sxm", "--model", "llama-3.1-8b",
                              "--out", out_dir)
    assert_one_line_error(code, err, fragment, out=out)
    assert not out_dir.exists()


@pytest.mark.parametrize("argv,fragment", [
    (["--measured-run", VLLM], "give --hw"),
    (["--measured-run", SGLANG, "--hw", "h100-sxm"], "does not name the model: give --model"),
    (["--hw", "h100-sxm", "--no-measured"], "--hw applies to --measured-run"),
])
def test_missing_device_or_model_is_one_line_error(tmp_path, capsys, argv, fragment):
    code, out, err = validate(capsys, *argv, "--out", tmp_path / "r")
    assert_one_line_error(code, err, fragment, out=out)
    assert not (tmp_path / "r").exists()


def test_fit_items_predict_each_metric_from_one_run_per_profile():
    (r,) = load_measured_runs(VLLM)
    items = fit_items(r, hw="h100-sxm", model="llama-3.1-8b", metrics=("ttft_s_p99", "tpot_s_p50"))
    assert [i.metric for i in items] == ["ttft_s_p99", "tpot_s_p50"]
    assert items[0].measured == pytest.approx(0.0924)
    fused = [i.predict("fused") for i in items]
    assert all(np.isfinite(v) and v > 0 for v in fused)
    assert [i.predict("fused") for i in items] == fused      # the profile's run is shared and cached
    assert items[1].predict("vllm") != fused[1]              # another profile: another step-time model
