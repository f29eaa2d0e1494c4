"""Benchmark only: our connector (vLLM < 0.22) with each file's timeline recorded.

`extract-timeline` is `extract` plus four wall-clock times per file, appended to
`<shared_storage_path>.timeline.jsonl` by the engine: submitted (the step queued its copy),
started (a writer thread took it), copied (its host copy was done), written (renamed into
place). `engine.py` reads them back per pass, so the time after the last engine step splits
into waiting for the copy, writing, and `generate` noticing.

It also records the engine thread's time in each call of the step's parts (HOST_TIMED: vLLM's
model runner and proposer, our connector's save), nested as vLLM nests them: the host work
between two steps is time the GPU waits once the host is held a launch queue ahead of it.
"""

from __future__ import annotations

import functools
import importlib
import json
import threading
import time
from concurrent.futures import Future
from typing import Any

from speculators_hybrid.vllm_patches import writer
from speculators_hybrid.vllm_patches.connector import HybridHiddenStatesConnector

SUFFIX = ".timeline.jsonl"
_lock = threading.Lock()
RUNNER = "vllm.v1.worker.gpu_model_runner:GPUModelRunner"
HOST_TIMED = (  # module:class, method (nested: execute_model holds _update_states, ...)
    (RUNNER, "execute_model"),
    (RUNNER, "_update_states"),
    (RUNNER, "_prepare_inputs"),
    (RUNNER, "_build_attention_metadata"),
    (RUNNER, "sample_tokens"),
    (RUNNER, "propose_draft_token_ids"),
    ("vllm.v1.spec_decode.extract_hidden_states:ExtractHiddenStatesProposer", "propose"),
    (f"{__name__}:TimelineConnector", "save_kv_layer"),
)


def _record(log: str, entry: dict[str, Any]) -> None:
    with _lock, open(log, "a") as f:
        f.write(json.dumps(entry) + "\n")


def _install(log: str) -> None:
    """Time every file the writer threads write (once per process)."""
    if getattr(writer, "_timeline_log", None) is not None:
        return
    writer._timeline_log = log  # type: ignore[attr-defined]
    submitted: dict[str, float] = {}
    submit, write = writer.FileWriter.submit, writer._write

    def timed_submit(files: Any, path: str, *a: Any, **k: Any) -> None:
        submitted[path] = time.time()
        submit(files, path, *a, **k)

    def timed_write(
        path: str, queued: Future, metadata: Any, lock: Any, fmt: str | None = None
    ) -> None:
        started = time.time()
        host, ready = queued.result()  # paced copies: once all pieces are queued
        if ready is not None:
            ready.synchronize()
        copied = time.time()
        done: Future = Future()
        done.set_result((host, None))
        write(path, done, metadata, lock, fmt)
        entry = dict(path=path, submitted=submitted.pop(path, None), started=started)
        _record(log, dict(entry, copied=copied, written=time.time()))

    writer.FileWriter.submit = timed_submit  # type: ignore[method-assign,assignment]
    writer._write = timed_write  # type: ignore[assignment]
    for owner, method in HOST_TIMED:
        _time_calls(log, owner, method)


def owner_class(owner: str) -> Any:
    """The class a HOST_TIMED owner ("module:Class") names; ImportError or AttributeError if
    this vLLM has none."""
    module, cls_name = owner.split(":")
    return getattr(importlib.import_module(module), cls_name)


def _time_calls(log: str, owner: str, method: str) -> None:
    """Record the host seconds of each call of `owner.method` (skipped where it is missing)."""
    try:
        cls = owner_class(owner)
    except (ImportError, AttributeError):
        return
    inner = getattr(cls, method, None)
    if inner is None:
        return
    name = f"{cls.__name__}.{method}"

    @functools.wraps(inner)
    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            _record(log, dict(call=name, host_s=time.perf_counter() - t0))

    setattr(cls, method, timed)


class TimelineConnector(HybridHiddenStatesConnector):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self._writer is not None:
            _install(self._dir.rstrip("/") + SUFFIX)
