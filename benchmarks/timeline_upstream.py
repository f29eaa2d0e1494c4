"""Benchmark only: vLLM's own hidden-states connector (vLLM >= 0.22) with each file's timeline.

The same entries as `timeline.py` for our connector, so `engine.timeline` sums them up alike:
submitted (the step queued the file's copy, `_submit_async_write`), started (a writer thread
took it), copied (its host copy was done) and written (the file in place; recorded just
before its lock is released), plus the engine thread's time in the step's parts and in the
connector's `get_finished`, where vLLM >= 0.24 queues a step's copies. With the plugin on,
`_write_tensors` is the patched one (hidden-states-provenance), as in `extract`. vLLM
0.22-0.23 queue the copies in the forward pass instead: their files have no submitted time, and
`engine.timeline` sums up nothing.
"""

from __future__ import annotations

import os
import time
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
)

from benchmarks import timeline
from benchmarks.timeline import HOST_TIMED, SUFFIX, _record, _time_calls, owner_class

__all__ = ["TimelineConnector", "UPSTREAM_TIMED", "owner_class"]
_log: str | None = None  # set by the first connector of the process
_submitted: dict[str, float] = {}
UPSTREAM_TIMED = (
    *(t for t in HOST_TIMED if not t[0].startswith(f"{timeline.__name__}:")),  # not our connector
    (f"{__name__}:TimelineConnector", "get_finished"),
)


class TimelineConnector(ExampleHiddenStatesConnector):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        global _log
        super().__init__(*args, **kwargs)
        if _log is None:
            _log = self._storage_path.rstrip("/") + SUFFIX
            for owner, method in UPSTREAM_TIMED:
                _time_calls(_log, owner, method)

    def _submit_async_write(self, pending: Any) -> None:
        _submitted[pending.filename] = time.time()
        super()._submit_async_write(pending)

    @staticmethod
    def _write_tensors(tensors: Any, event: Any, filename: str, lock_fd: int | None) -> None:
        started = time.time()
        try:
            event.synchronize()  # the write below waits for it again: already done then
            copied = time.time()
            ExampleHiddenStatesConnector._write_tensors(tensors, event, filename, None)
            if _log is not None:  # before the lock goes: a reader that saw it sees this too
                entry = dict(path=filename, submitted=_submitted.pop(filename, None))
                _record(_log, dict(entry, started=started, copied=copied, written=time.time()))
        finally:
            if lock_fd is not None:
                os.close(lock_fd)  # releases the reader's wait, as vLLM's own does
