"""sim.des.slo_runs: the SLO search on two worker processes gives the serial search's answer, probes and
their order; a failing run's error reaches the caller; guesses left running are stopped."""
from __future__ import annotations

import json

import pytest

from sim.des import slo_runs
from sim.des.serving import ServeConfig
from sim.des.slo import SLO, find_max_qps

# a small memory-bound point whose search settles in about a second (tests/sim/test_serving_sweeps.py)
SMALL = dict(hw="l4", model="llama-2-7b", prompt=2048, gen=16, arrivals="gamma", cv=0.1)


def _answer(found) -> str:
    out = found.to_dict()
    return json.dumps(out, sort_keys=True, default=str)


@pytest.mark.parametrize("slo", [SLO(slo_ttft_p99=2.0), SLO(slo_ttft_p99=2.0, slo_tpot_p99=0.2)])
def test_two_workers_give_the_serial_search(slo):
    cfg = ServeConfig(**SMALL)
    serial = find_max_qps(cfg, slo, requests=100, workers=1)
    parallel = find_max_qps(cfg, slo, requests=100, workers=2)
    assert _answer(parallel) == _answer(serial)
    host = {"wall_s"}                              # the host seconds a run took
    assert ({k: v for k, v in parallel.at_max.to_dict().items() if k not in host}
            == {k: v for k, v in serial.at_max.to_dict().items() if k not in host})


def _square(x):
    return x * x


def _fail(x):
    raise ValueError(f"bad {x}")


def test_runs_stop_unwanted_guesses_and_pass_errors_on():
    runs = slo_runs.Runs(2)
    try:
        runs.want([("a", _square, (3,)), ("b", _square, (4,))])
        assert runs.get("a", _square, (3,)) == 9
        runs.want([("c", _square, (5,))])          # "b", if still going, is no longer wanted
        assert runs.get("c", _square, (5,)) == 25
        with pytest.raises(ValueError, match="bad 7"):
            runs.get("d", _fail, (7,))
    finally:
        runs.close()
    assert not runs._running


def test_one_worker_runs_in_this_process():
    runs = slo_runs.Runs(1)
    runs.want([("a", _fail, (1,))])                # nothing starts ahead
    assert runs.get("b", _square, (6,)) == 36
