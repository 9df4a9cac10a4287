"""Workloads: Poisson and gamma arrival statistics, replay files, and their error messages."""
from __future__ import annotations

import math

import numpy as np
import pytest

from sim.des.arrivals import load_workload, make_workload, synthetic_workload


def test_poisson_rate_and_first_arrival_at_zero():
    wl = synthetic_workload("poisson", 4.0, 20_000, 128, 64, seed=1)
    gaps = np.diff(wl.arrival_s)
    assert wl.arrival_s[0] == 0.0
    assert gaps.mean() == pytest.approx(0.25, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)  # exponential gaps: CV = 1
    assert (wl.prompt_tokens == 128).all() and (wl.output_tokens == 64).all()


@pytest.mark.parametrize("cv", [0.5, 1.0, 3.0])
def test_gamma_keeps_the_rate_and_sets_the_cv(cv):
    wl = synthetic_workload("gamma", 10.0, 40_000, 16, 16, cv=cv, seed=2)
    gaps = np.diff(wl.arrival_s)
    assert gaps.mean() == pytest.approx(0.1, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.08)


def test_infinite_rate_sends_everything_at_once_and_seed_controls_draws():
    assert (synthetic_workload("poisson", math.inf, 5, 8, 8).arrival_s == 0).all()
    a, b = (synthetic_workload("poisson", 2.0, 50, 8, 8, seed=s).arrival_s for s in (1, 1))
    assert np.array_equal(a, b)
    assert not np.array_equal(a, synthetic_workload("poisson", 2.0, 50, 8, 8, seed=2).arrival_s)


def test_csv_replay_sorts_by_arrival_and_accepts_aliases(tmp_path):
    path = tmp_path / "reqs.csv"
    path.write_text("timestamp,input_len,output_len\n2.0,10,5\n0.5,20,6\n1.0,30,7\n")
    wl = load_workload(path)
    assert wl.arrival_s.tolist() == [0.5, 1.0, 2.0]
    assert wl.prompt_tokens.tolist() == [20, 30, 10] and wl.output_tokens.tolist() == [6, 7, 5]
    assert load_workload(path, requests=2).arrival_s.tolist() == [0.5, 1.0]


def test_jsonl_replay(tmp_path):
    path = tmp_path / "reqs.jsonl"
    path.write_text('{"arrival_s": 0, "prompt_tokens": 3, "output_tokens": 4}\n\n'
                    '{"arrival_s": 0.1, "prompt_tokens": 5, "output_tokens": 6}\n')
    wl = make_workload(str(path), qps=1.0, requests=None, prompt=None, gen=None)
    assert len(wl) == 2 and wl.prompt_tokens.tolist() == [3, 5]


@pytest.mark.parametrize("content,suffix,message", [
    ("a,b,c\n1,2,3\n", ".csv", "no arrival time column"),
    ("arrival_s,prompt_tokens,output_tokens\n0,x,3\n", ".csv", "non-numeric"),
    ("arrival_s,prompt_tokens,output_tokens\n0,0,3\n", ".csv", "whole numbers >= 1"),
    ("arrival_s,prompt_tokens,output_tokens\n-1,5,3\n", ".csv", ">= 0 seconds"),
    ('{"arrival_s": 0,\n', ".jsonl", "not valid JSON"),
    ("", ".csv", "not a readable CSV"),
])
def test_bad_replay_files_raise_one_clear_message(tmp_path, content, suffix, message):
    path = tmp_path / f"reqs{suffix}"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        load_workload(path)


def test_missing_file_and_bad_parameters():
    with pytest.raises(FileNotFoundError, match="poisson, gamma or a CSV/JSONL"):
        make_workload("nope.csv", 1.0, 10, 8, 8)
    with pytest.raises(ValueError, match="qps must be > 0"):
        synthetic_workload("poisson", 0.0, 10, 8, 8)
    with pytest.raises(ValueError, match="cv must be"):
        synthetic_workload("gamma", 1.0, 10, 8, 8, cv=0.0)
    with pytest.raises(ValueError, match="needs requests, prompt and gen"):
        make_workload("gamma", 1.0, 10, None, 8)
