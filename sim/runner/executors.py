"""Where chunks run: in this process, on local worker processes, or on a Dask cluster."""
from __future__ import annotations

import multiprocessing
import queue
import signal
from collections.abc import Callable, Iterator

import pandas as pd

DASK_CONNECT_TIMEOUT = "10s"   # how long to wait for a Dask scheduler before a one-line error

Evaluate = Callable[[pd.DataFrame], pd.DataFrame]


def _call(evaluate: Evaluate, chunk_id: int, chunk: pd.DataFrame) -> tuple[int, pd.DataFrame]:
    return chunk_id, evaluate(chunk)


class LocalExecutor:
    """In this process, one chunk after another."""
    workers = 1

    def imap(self, evaluate: Evaluate, chunks: Iterator[tuple[int, pd.DataFrame]]):
        for chunk_id, chunk in chunks:
            yield _call(evaluate, chunk_id, chunk)

    def describe(self) -> str:
        return "local"


def _ignore_sigint() -> None:
    # Ctrl-C goes to the whole process group; the parent handles it and terminates the pool, so the
    # workers must not each print a KeyboardInterrupt traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class ProcessExecutor:
    """N local worker processes (spawned: no fork-with-threads hazards), at most 2 chunks in flight each."""

    def __init__(self, workers: int):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.workers = workers

    def describe(self) -> str:
        return f"{self.workers} local processes"

    def imap(self, evaluate: Evaluate, chunks: Iterator[tuple[int, pd.DataFrame]]):
        done: queue.Queue = queue.Queue()
        pool = multiprocessing.get_context("spawn").Pool(self.workers, initializer=_ignore_sigint)
        try:
            in_flight = 0
            for chunk_id, chunk in chunks:
                pool.apply_async(_call, (evaluate, chunk_id, chunk), callback=done.put,
                                 error_callback=done.put)
                in_flight += 1
                while in_flight >= 2 * self.workers:
                    yield _unwrap(done.get())
                    in_flight -= 1
            while in_flight:
                yield _unwrap(done.get())
                in_flight -= 1
            pool.close()
            pool.join()
        finally:
            pool.terminate()  # on an interrupt or error: stop the workers now, finished chunks are saved


def _unwrap(item):
    if isinstance(item, BaseException):
        raise item
    return item


class DaskExecutor:
    """A Dask distributed cluster (``ADDRESS`` of its scheduler, or a ``distributed.Client``).

    Workers need kvsim importable (``pip install kvsim`` there). Chunks are submitted through a
    bounded window (4 per worker thread), so a 10^7-point sweep never holds every chunk in the
    scheduler's memory."""

    def __init__(self, scheduler, connect_timeout: str | None = None):
        try:
            from distributed import Client
        except ImportError as exc:  # the optional 'scale' extra
            raise ValueError("--scheduler needs dask distributed: pip install 'kvsim[scale]'") from exc
        if isinstance(scheduler, Client):
            self.client, self._own_client = scheduler, False
        else:
            try:
                self.client = Client(scheduler, timeout=connect_timeout or DASK_CONNECT_TIMEOUT)
            except (OSError, TimeoutError) as exc:
                raise ValueError(f"cannot reach the Dask scheduler at {scheduler}: {exc}") from None
            self._own_client = True
        threads = sum(self.client.nthreads().values())
        self.workers = max(1, threads)

    def describe(self) -> str:
        return f"Dask cluster at {self.client.scheduler.address} ({self.workers} worker threads)"

    def imap(self, evaluate: Evaluate, chunks: Iterator[tuple[int, pd.DataFrame]]):
        from distributed import as_completed
        futures = as_completed()
        pending = []
        try:
            for chunk_id, chunk in chunks:
                future = self.client.submit(_call, evaluate, chunk_id, chunk, pure=False)
                pending.append(future)
                futures.add(future)
                # 4 per worker: enough queued that shipping inputs and results overlaps computing
                while futures.count() >= 4 * self.workers:
                    finished = next(futures)
                    pending.remove(finished)
                    yield finished.result()
            for finished in futures:
                pending.remove(finished)
                yield finished.result()
        finally:
            if pending:
                self.client.cancel(pending)

    def close(self) -> None:
        if self._own_client:
            self.client.close()


def make_executor(workers: int | None = None, scheduler=None):
    """``scheduler`` wins over ``workers``; neither means in-process."""
    if scheduler:
        return DaskExecutor(scheduler)
    if workers and workers > 1:
        return ProcessExecutor(workers)
    return LocalExecutor()
