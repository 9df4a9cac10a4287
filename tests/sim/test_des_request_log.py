"""sim.des.request_log: the per-request CSV written as requests finish is the whole table's to_csv, byte
for byte, whatever the chunking; a failed run leaves no file."""
from __future__ import annotations

import pytest

from sim.des import request_log
from sim.des.serving import ServeConfig, run_config

# preemptions, lognormal lengths and chunked prefill: requests finish out of order
CFG = dict(hw="a100-80g-sxm", model="llama-2-7b", prompt=1024, gen=512, qps=20.0, requests=300,
           chunked_prefill=512, prompt_dist="lognormal:1", gen_dist="uniform:1")


def test_incremental_csv_equals_the_table(tmp_path, monkeypatch):
    monkeypatch.setattr(request_log, "CHECK_EVERY", 1)
    monkeypatch.setattr(request_log, "MIN_ROWS", 7)
    monkeypatch.setattr(request_log, "SCAN", 5)
    path = tmp_path / "requests.csv"
    res = run_config(ServeConfig(**CFG), per_request=path)
    assert res.preemptions > 0
    whole = tmp_path / "whole.csv"
    res.requests.to_csv(whole, index=False)
    assert path.read_bytes() == whole.read_bytes()
    assert [p.name for p in tmp_path.iterdir() if ".tmp" in p.name] == []


def test_failed_run_leaves_no_file(tmp_path, monkeypatch):
    path = tmp_path / "requests.csv"

    def boom(self, sched):
        raise RuntimeError("step failed")
    monkeypatch.setattr(request_log.RequestLog, "after_step", boom)
    with pytest.raises(RuntimeError):
        run_config(ServeConfig(**{**CFG, "requests": 20}), per_request=path)
    assert list(tmp_path.iterdir()) == []
