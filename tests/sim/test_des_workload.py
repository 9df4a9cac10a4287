"""Request-trace replay (sim.des.trace_file, sim.des.workload) through `sim.serve --workload` and
`sim.sweep --workload`: as recorded, time-scaled, windowed, overlong requests, empirical lengths, bad input."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from sim.des.trace_file import bundled_path, load_trace
from sim.des.workload import replay_workload
from sim.serve import main as serve
from tests.helpers import assert_one_line_error

HW, MODEL = "h100-sxm", "llama-3-8b"      # llama-3-8b: 8192 positions
# the Azure trace's spelling: a date-time stamp, prompt and output tokens
AZURE_ROWS = ["2023-11-16 18:15:46.6805900,374,44", "2023-11-16 18:15:47.1805900,396,109",
              "2023-11-16 18:15:47.6805900,879,20", "2023-11-16 18:15:49.6805900,91,7",
              "2023-11-16 18:15:50.1805900,1200,64", "2023-11-16 18:15:52.6805900,300,5"]
OFFSETS = np.array([0.0, 0.5, 1.0, 3.0, 3.5, 6.0])


def azure_csv(path, rows=AZURE_ROWS, header="TIMESTAMP,ContextTokens,GeneratedTokens"):
    path.write_text(header + "\n" + "\n".join(rows) + "\n")
    return path


def serve_cli(capsys, *argv):
    code = serve([*argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_trace_replays_its_arrival_times_and_lengths_as_recorded(tmp_path, capsys):
    trace = azure_csv(tmp_path / "t.csv")
    per_request = tmp_path / "req.csv"
    code, out, err = serve_cli(capsys, "--hw", HW, "--model", MODEL, "--workload", str(trace), "--json",
                               "--no-progress", "--per-request", str(per_request))
    assert code == 0, err
    res = json.loads(out)
    assert res["completed"] == 6 and res["config"]["requests"] == 6
    replay = res["config"]["replay"]
    assert replay["time_scale"] == 1.0 and replay["overlong_requests"] == 0
    assert "Splitwise" in replay["attribution"]          # the Azure spelling keeps the CC-BY attribution
    rows = pd.read_csv(per_request)
    assert np.allclose(rows["arrival_s"], OFFSETS)
    assert rows["prompt_tokens"].tolist() == [374, 396, 879, 91, 1200, 300]
    assert rows["output_tokens"].tolist() == [44, 109, 20, 7, 64, 5]


def test_qps_time_scales_the_arrivals_keeping_their_shape(tmp_path, capsys):
    trace = azure_csv(tmp_path / "t.csv")
    recorded = 5 / 6.0
    per_request = tmp_path / "req.csv"
    code, out, err = serve_cli(capsys, "--hw", HW, "--model", MODEL, "--workload", str(trace), "--qps",
                               str(recorded * 4), "--json", "--no-progress", "--per-request", str(per_request))
    assert code == 0, err
    assert json.loads(out)["config"]["replay"]["time_scale"] == pytest.approx(0.25)
    assert np.allclose(pd.read_csv(per_request)["arrival_s"], OFFSETS / 4)   # every gap a quarter: same shape


def test_window_selects_the_requests_arriving_in_it(tmp_path, capsys):
    trace = azure_csv(tmp_path / "t.csv")
    per_request = tmp_path / "req.csv"
    code, out, err = serve_cli(capsys, "--hw", HW, "--model", MODEL, "--workload", str(trace), "--window", "0.9:3.6",
                               "--json", "--no-progress", "--per-request", str(per_request))
    assert code == 0, err
    rows = pd.read_csv(per_request)
    assert rows["prompt_tokens"].tolist() == [879, 91, 1200]
    assert np.allclose(rows["arrival_s"], [0.0, 2.0, 2.5])        # shifted to start at 0


def test_overlong_requests_are_counted_and_dropped_or_clipped(tmp_path, capsys):
    trace = azure_csv(tmp_path / "t.csv")
    code, out, err = serve_cli(capsys, "--hw", HW, "--model", MODEL, "--workload", str(trace),
                               "--max-model-len", "500", "--no-progress")
    assert code == 0, err
    assert "workload: 3 requests" in out                         # 879+20, 1200+64 and 396+109 exceed 500
    assert "overlong requests (prompt + output > 500 tokens): 3 dropped" in out
    per_request = tmp_path / "req.csv"
    code, out, err = serve_cli(capsys, "--hw", HW, "--model", MODEL, "--workload", str(trace), "--max-model-len",
                               "500", "--overlong", "clip", "--json", "--no-progress", "--per-request", str(per_request))
    assert code == 0, err
    assert json.loads(out)["config"]["replay"]["overlong_requests"] == 3
    rows = pd.read_csv(per_request)
    assert len(rows) == 6 and (rows["prompt_tokens"] + rows["output_tokens"]).max() <= 500
    # nothing is over the model's own context: the count is shown as zero, never left out
    code, out, _ = serve_cli(capsys, "--hw", HW, "--model", MODEL, "--workload", str(trace), "--no-progress")
    assert "overlong requests (prompt + output > 8192 tokens): 0 dropped" in out


@pytest.mark.parametrize("rows,header,fragment", [
    (AZURE_ROWS, "TIMESTAMP,ContextTokens", "no output length column"),
    ([AZURE_ROWS[0], "2023-11-16 18:15:47.1805900,-5,109"], None, "row 3 (line 3), column ContextTokens"),
    ([AZURE_ROWS[0], "2023-11-16 18:15:47.1805900,many,109"], None, "not a number"),
    ([AZURE_ROWS[1], AZURE_ROWS[0]], None, "timestamps out of order"),
    (["yesterday,10,10", AZURE_ROWS[0]], None, "not a time"),
    ([], None, "no requests in the file"),
])
def test_bad_traces_are_one_line_errors_and_write_nothing(tmp_path, capsys, rows, header, fragment):
    trace = azure_csv(tmp_path / "t.csv", rows, header or "TIMESTAMP,ContextTokens,GeneratedTokens")
    per_request = tmp_path / "req.csv"
    code, out, err = serve_cli(capsys, "--hw", HW, "--model", MODEL, "--workload", str(trace), "--no-progress",
                               "--per-request", str(per_request))
    assert_one_line_error(code, err, fragment, out=out)
    assert not per_request.exists()


@pytest.mark.parametrize("argv,fragment", [
    (["--window", "10:20"], "holds no request"),
    (["--window", "5"], "--window must be START:END"),
    (["--prompt", "100"], "drop --prompt"),
    (["--overlong", "trim"], "invalid choice"),
])
def test_bad_replay_flags_are_one_line_errors(tmp_path, capsys, argv, fragment):
    trace = azure_csv(tmp_path / "t.csv")
    code, out, err = serve_cli(capsys, "--hw", HW, "--model", MODEL, "--workload", str(trace), "--no-progress", *argv)
    assert_one_line_error(code, err, fragment, out=out)


def test_window_without_a_trace_is_an_error(capsys):
    code, out, err = serve_cli(capsys, "--hw", HW, "--model", MODEL, "--prompt", "10", "--gen", "10", "--window", "0:1")
    assert_one_line_error(code, err, "add --workload", out=out)


def test_kvsim_replay_files_load_too(tmp_path):
    path = tmp_path / "own.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n0.5,20,5\n2.0,30,5\n")
    w = replay_workload(path, qps=2.0)          # recorded: 2 gaps over 2 s = 1 req/s, so every time halves
    assert w.prompt_tokens.tolist() == [10, 20, 30] and "attribution" not in w.notes
    assert np.allclose(w.arrival_s, [0.0, 0.25, 1.0]) and w.notes["time_scale"] == pytest.approx(0.5)


def test_empirical_lengths_come_from_the_trace(tmp_path, capsys):
    trace = azure_csv(tmp_path / "t.csv")
    per_request = tmp_path / "req.csv"
    code, out, err = serve_cli(capsys, "--hw", HW, "--model", MODEL, "--requests", "40", "--qps", "5",
                               "--prompt-dist", f"empirical:{trace}", "--gen-dist", f"empirical:{trace}",
                               "--no-progress", "--per-request", str(per_request), "--json")
    assert code == 0, err
    rows = pd.read_csv(per_request)
    # no --prompt / --gen: the trace's mean, so the draws are the trace's own lengths
    assert set(rows["prompt_tokens"]) <= {374, 396, 879, 91, 1200, 300}
    assert set(rows["output_tokens"]) <= {44, 109, 20, 7, 64, 5}
    assert len(set(rows["prompt_tokens"])) > 2
    assert "Splitwise" in json.loads(out)["config"]["replay"]["attribution"]
    code, out, err = serve_cli(capsys, "--hw", HW, "--model", MODEL, "--requests", "5", "--gen", "8",
                               "--prompt-dist", "empirical:nowhere.csv", "--no-progress")
    assert_one_line_error(code, err, "nowhere.csv", out=out)


def test_time_scaled_replay_feeds_the_slo_search(tmp_path, capsys):
    trace = azure_csv(tmp_path / "t.csv")
    code, out, err = serve_cli(capsys, "--hw", HW, "--model", MODEL, "--workload", str(trace), "--find-max-qps",
                               "--slo-ttft-p99", "0.05", "--json", "--no-progress")
    assert code == 0, err
    found = json.loads(out)      # all six at once miss 50 ms; the search scales the trace's rate to meet it
    assert found["runs"] > 2 and 1 < found["max_qps"] < found["fail_qps"]
    assert all(p["qps"] == "inf" or p["qps"] > 0 for p in found["probes"])
    assert found["config"].get("request_trace") == str(trace)


def test_sweep_replays_the_trace_at_each_rate(tmp_path, capsys):
    from sim.cli import run
    from sim.sweep import main as sweep_main

    def sweep(argv):
        return run(sweep_main, argv)
    trace = azure_csv(tmp_path / "t.csv")
    code = sweep(["--engine", "des", "--hw", HW, "--models", MODEL, "--policies", "full,h2o", "--cache-ratios", "0.5",
                  "--batches", "16", "--workload", str(trace), "--qps", "1,4", "--traces", "none", "--no-plots",
                  "--no-cache", "--csv", "--out", str(tmp_path / "sw")])
    out, err = capsys.readouterr()
    assert code == 0, err
    table = pd.read_csv(tmp_path / "sw" / "points.csv")
    assert len(table) == 4 and set(table["qps"]) == {1.0, 4.0}
    assert (table["completed"] == 6).all() and (table["workload"] == str(trace)).all()
    assert (table["overlong_requests"] == 0).all()
    assert table["prompt"].iloc[0] == round(np.mean([374, 396, 879, 91, 1200, 300]))   # the trace's mean request
    summary = (tmp_path / "sw" / "summary.md").read_text()
    assert "replay of the request trace" in summary and "Splitwise" in summary
    code = sweep(["--engine", "des", "--hw", HW, "--models", MODEL, "--workload", str(trace), "--prompts", "100",
                  "--traces", "none", "--no-cache", "--out", str(tmp_path / "sw2")])
    out, err = capsys.readouterr()
    assert_one_line_error(code, err, "drop --prompts")
    assert not (tmp_path / "sw2").exists()


def test_step_grid_is_within_1e4_of_exact_steps():
    from sim.des.analytic import AnalyticTimer
    from sim.des.step_grid import GridDecodeTimer
    exact = AnalyticTimer(HW, MODEL, policy="full", cache_ratio=1.0, recent_ratio=0.3, weight_dtype="bf16",
                          kv_dtype="bf16", profile="fused")
    grid = GridDecodeTimer(exact, 64)
    rng = np.random.default_rng(0)
    for _ in range(300):
        kv = rng.integers(5, 20000, size=int(rng.integers(1, 128))).astype(float)
        assert grid.decode(kv) == pytest.approx(exact.decode(kv), rel=1e-4)


def test_bundled_conversation_trace():
    if not bundled_path("azure-conv-2023").is_file():
        pytest.skip("../shared/data/azure-llm-inference-2023/ not here (set KVSIM_DATA)")
    trace = load_trace("azure-conv-2023")
    assert len(trace) == 19366 and trace.mean_rate == pytest.approx(5.53, abs=0.01)
    assert int(np.median(trace.prompt_tokens)) == 1020 and int(np.median(trace.output_tokens)) == 129
    w = replay_workload("azure-conv-2023", qps=11.06, window="0:600")
    assert w.notes["time_scale"] == pytest.approx(w.notes["recorded_qps"] / 11.06)
    assert w.arrival_s[-1] <= 600 * w.notes["time_scale"]
