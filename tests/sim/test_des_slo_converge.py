"""sim.des.slo_converge: the search with one converging run per rate (`converge=`, `--slo-converge`)."""
from __future__ import annotations

import json

import pytest

from sim.des.serving import ServeConfig
from sim.des.slo import SLO, find_max_qps
from sim.serve import main as serve_main
from tests.helpers import assert_one_line_error

# the memory-bound point of tests/sim/test_serving_sweeps.py: nearly regular arrivals, a sharp TTFT edge
SMALL = dict(hw="l4", model="llama-2-7b", prompt=2048, gen=16, arrivals="gamma", cv=0.1)
SMALL_SLO = SLO(slo_ttft_p99=2.0)


def test_converging_runs_find_the_rate_of_the_doubling_search():
    cfg = ServeConfig(**SMALL)
    doubling = find_max_qps(cfg, SMALL_SLO, requests=100)
    found = find_max_qps(cfg, SMALL_SLO, requests=100, converge=0.05, workers=2)
    assert found.stable and 0 < found.max_qps < found.fail_qps <= 1.05 * found.max_qps * (1 + 1e-9)
    assert max(found.max_qps, doubling.max_qps) / min(found.max_qps, doubling.max_qps) <= 1.1
    # each probe says at which length it stopped: a doubling of the first length, at least twice it
    assert all(p.requests in (100, 200, 400, 800, 1600, 3200) for p in found.probes[1:])
    assert all(p.requests >= 200 for p in found.probes[1:] if p.ok)
    assert "within 5%" in found.criterion and found.runs == len(found.probes)


def test_workers_do_not_change_a_converging_search():
    cfg = ServeConfig(**SMALL)
    one = find_max_qps(cfg, SMALL_SLO, requests=100, converge=0.05, workers=1)
    two = find_max_qps(cfg, SMALL_SLO, requests=100, converge=0.05, workers=2)
    assert json.dumps(one.to_dict(), default=str) == json.dumps(two.to_dict(), default=str)


def test_cli_slo_converge(capsys):
    argv = ["--hw", "l4", "--model", "llama-2-7b", "--prompt", "2048", "--gen", "16", "--arrivals", "gamma",
            "--cv", "0.1", "--requests", "100", "--slo-ttft-p99", "2", "--find-max-qps", "--no-progress",
            "--slo-converge", "0.05"]
    assert serve_main(argv + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["steady_state"]["stable"] and "within 5%" in out["steady_state"]["criterion"]
    assert serve_main(argv) == 0
    assert "converged: both ends of the bracket" in capsys.readouterr().out


@pytest.mark.parametrize("extra,message", [
    (["--find-max-qps", "--slo-ttft-p99", "2", "--slo-converge", "0"], "--slo-converge must be in (0, 1)"),
    (["--slo-converge", "0.05"], "limits of --find-max-qps"),
])
def test_cli_slo_converge_errors(capsys, extra, message):
    base = ["--hw", "l4", "--model", "llama-2-7b", "--prompt", "512", "--gen", "16", "--no-progress"]
    assert_one_line_error(serve_main(base + extra), capsys.readouterr().err, message)
