"""One computation on several processes at once: worker 0 is this process, the others forked children,
all taking pieces of work from one `SharedCounter` and writing results into memory the parent sees
(`shared_empty`). For work whose inputs are already in memory (a sweep's sorted points): a fork inherits
them, and its results need no pickling, unlike a spawned pool's (sim.runner.executors), which pays an
interpreter start and a copy of its chunk per task.
"""
from __future__ import annotations

import mmap
import multiprocessing
import os
from collections.abc import Callable

import numpy as np


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS tells it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def can_fork() -> bool:
    """Whether shares can run in forked children: a platform with fork, and not inside a daemon worker
    (a daemon process cannot start its own)."""
    return "fork" in multiprocessing.get_all_start_methods() and not multiprocessing.current_process().daemon


def shared_empty(n: int, dtype) -> np.ndarray:
    """An uninitialised array of n items in anonymous shared memory: what a forked child writes into it,
    the parent reads. Otherwise an ordinary writable array; its memory lives as long as the array does."""
    dtype = np.dtype(dtype)
    buffer = mmap.mmap(-1, max(1, n * dtype.itemsize))       # MAP_SHARED | MAP_ANONYMOUS
    return np.frombuffer(buffer, dtype=dtype, count=n)


class SharedCounter:
    """0, 1, 2, ... handed out once each across this process and its forked children (a lock-protected
    integer in shared memory): how the workers of `run_forked` take the next piece of work."""

    def __init__(self):
        self._value = multiprocessing.get_context("fork" if can_fork() else None).Value("q", 0)

    def take(self) -> int:
        with self._value.get_lock():
            taken = self._value.value
            self._value.value = taken + 1
        return taken


def child(conn, fn, args) -> None:
    """A forked child's body: fn(*args) sent back through `conn` as (True, result), or (False, exception)."""
    try:
        conn.send((True, fn(*args)))
    except BaseException as exc:          # the parent raises it (a user error keeps its one line)
        conn.send((False, exc))
    finally:
        conn.close()


def run_forked(fn: Callable[[int], object], workers: int) -> list:
    """[fn(0), fn(1), ..., fn(workers - 1)], all at once: fn(0) in this process, each other in a forked
    child. A child's exception is raised here (after every worker has ended); an interrupt stops the
    children. Without fork on this platform: one after another, here."""
    if workers <= 1 or not can_fork():
        return [fn(k) for k in range(max(1, workers))]
    ctx = multiprocessing.get_context("fork")
    children = []
    try:
        for k in range(1, workers):
            receive, send = ctx.Pipe(duplex=False)
            process = ctx.Process(target=child, args=(send, fn, (k,)), daemon=True)
            process.start()
            send.close()
            children.append((process, receive))
        results = [fn(0)]
        for k, (process, conn) in enumerate(children, start=1):
            try:
                ok, value = conn.recv()
            except EOFError:              # the child died without a word (killed from outside)
                ok, value = False, RuntimeError(f"worker process {k} of {workers} ended without a result")
            process.join()
            if not ok:
                raise value
            results.append(value)
        return results
    finally:
        for process, conn in children:
            if process.is_alive():
                process.terminate()
                process.join()
            conn.close()
