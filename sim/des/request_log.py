"""`--per-request`'s CSV written while the simulation runs: one row per request, in request order.

A request's row is final once it is done or dropped, so the log writes the longest run of finished
requests after the last row written, in chunks of at least MIN_ROWS, and the rest (requests still unfinished
when a run is stopped early) at the end. The file is the one `DataFrame.to_csv(index=False)` of the whole
table would write, byte for byte: pandas formats each value on its own (tests/sim/test_des_request_log.py).
Written to `NAME.tmp.csv` next to it and moved into place when complete, as kvcommon.cli.atomic_writer.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from .metrics import request_columns, request_frame
from .scheduler import DONE, DROPPED

CHECK_EVERY = 64        # steps between two looks for finished rows
MIN_ROWS = 4096         # rows written at once (fewer pandas calls)
SCAN = 4096             # statuses read at once when looking for the first unfinished request


class RequestLog:
    def __init__(self, path):
        self.path = Path(path)
        self._tmp = self.path.with_name(self.path.name + ".tmp" + self.path.suffix)
        self._file = open(self._tmp, "w", newline="")
        self._next = 0          # first request not yet written
        self.closed = False
        self._steps = 0

    def _finished_prefix(self, status: np.ndarray) -> int:
        """The first request at or after the last written one that is neither done nor dropped."""
        i = self._next
        while i < len(status):
            block = status[i:i + SCAN]
            waiting = np.flatnonzero((block != DONE) & (block != DROPPED))
            if len(waiting):
                return i + int(waiting[0])
            i += len(block)
        return len(status)

    def _write(self, cols: dict, stop: int) -> None:
        if stop > self._next:
            request_frame(cols, self._next, stop).to_csv(self._file, index=False, header=self._next == 0)
            self._next = stop

    def after_step(self, sched) -> None:
        """sim.des.server's per-step callback."""
        self._steps += 1
        if self._steps % CHECK_EVERY:
            return
        ready = self._finished_prefix(sched.status)
        if ready - self._next >= MIN_ROWS:
            self._write(request_columns(sched), ready)

    def close(self, sched) -> None:
        """Write the remaining rows and move the file into place."""
        self._write(request_columns(sched), sched.n_requests)
        self._file.close()
        os.replace(self._tmp, self.path)
        self.closed = True

    def abort(self) -> None:
        """A failed run leaves no file (and an earlier one as it was)."""
        self._file.close()
        self.closed = True
        if self._tmp.exists():
            self._tmp.unlink()
