"""sim.runner.forked: workers on forked processes, results in shared memory, child errors raised here."""
import os

import numpy as np
import pytest

from sim.runner.forked import SharedCounter, can_fork, run_forked, shared_empty, usable_cores

needs_fork = pytest.mark.skipif(not can_fork(), reason="this platform cannot fork")


@needs_fork
def test_workers_run_in_other_processes_and_write_shared_memory():
    out = shared_empty(4, np.int64)
    counter = SharedCounter()

    def worker(k):
        taken = []
        while (i := counter.take()) < 4:
            out[i] = os.getpid()
            taken.append(i)
        return k, os.getpid(), taken

    results = run_forked(worker, 2)
    assert [k for k, _, _ in results] == [0, 1]
    pids = [pid for _, pid, _ in results]
    assert pids[0] == os.getpid() and pids[1] != os.getpid()          # worker 1 ran in a child
    assert sorted(i for _, _, items in results for i in items) == [0, 1, 2, 3]   # every item once
    for _, pid, items in results:                      # each worker's writes, the child's too, are seen here
        assert all(out[i] == pid for i in items)


@needs_fork
def test_a_childs_error_is_raised_here_with_its_message():
    def worker(k):
        if k == 1:
            raise ValueError("bad point in the child")
        return k

    with pytest.raises(ValueError, match="bad point in the child"):
        run_forked(worker, 2)


def test_one_worker_runs_here():
    assert run_forked(lambda k: (k, os.getpid()), 1) == [(0, os.getpid())]
    assert usable_cores() >= 1
