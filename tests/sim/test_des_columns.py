"""sim.des.columns: the run-length ITL record gives numpy's statistics of the expanded sample bit for bit,
and the step columns keep every row."""
from __future__ import annotations

import numpy as np
import pytest

from sim.des import columns
from sim.des.columns import RunLengths, StepColumns, summarize_runs
from sim.des.metrics import summarize


def _record(chunks) -> RunLengths:
    runs = RunLengths(capacity=2)
    for chunk in chunks:
        runs.extend(np.asarray(chunk, dtype=float))
    return runs


@pytest.mark.parametrize("seed,steps,batch", [(0, 1, 1), (1, 3, 5), (2, 200, 40), (3, 2000, 300)])
def test_runs_reproduce_the_pooled_sample_and_its_statistics(seed, steps, batch):
    # steps of a few distinct gaps each (most requests share the previous step's end), as a decode batch has
    rng = np.random.default_rng(seed)
    chunks = []
    for _ in range(steps):
        n = int(rng.integers(1, batch + 1))
        chunks.append(rng.choice(rng.exponential(0.05, size=3), size=n))
    runs = _record(chunks)
    pooled = np.concatenate(chunks)
    assert np.array_equal(runs.expand(), pooled)
    assert runs.size == len(pooled) and runs.runs <= len(pooled)
    assert summarize_runs(runs) == summarize(pooled)      # exact: the same floats, not approximately


def test_pairwise_mean_is_exact_past_the_leaf(monkeypatch):
    # a small leaf makes the replayed recursion split many times (numpy's tree over the whole sample)
    monkeypatch.setattr(columns, "LEAF", 256)
    rng = np.random.default_rng(7)
    chunks = [rng.exponential(size=int(k)) for k in rng.integers(1, 900, size=400)]
    chunks += [np.full(5000, 0.1), np.full(3, 1e-9)]
    runs = _record(chunks)
    pooled = np.concatenate(chunks)
    assert summarize_runs(runs)["mean"] == float(pooled.mean())
    assert summarize_runs(runs) == summarize(pooled)


def test_empty_and_single_value():
    assert summarize_runs(RunLengths()) == summarize([])
    one = _record([[0.25]])
    assert summarize_runs(one) == summarize([0.25])


def test_equal_gaps_across_steps_merge_into_one_run():
    runs = _record([[0.1, 0.1], [0.1], [0.2, 0.1]])
    assert runs.runs == 3 and runs.counts.tolist() == [3, 1, 1]


def test_step_columns_grow_and_keep_rows():
    cols = StepColumns({"t": np.float64, "n": np.int64}, capacity=1)
    for i in range(37):
        cols.append(i * 0.5, i)
    out = cols.arrays()
    assert out["t"].tolist() == [i * 0.5 for i in range(37)] and out["n"].dtype == np.int64
    assert out["n"].tolist() == list(range(37))
