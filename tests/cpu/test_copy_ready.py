"""hidden-states-copy-when-ready (vLLM >= 0.24): a finished request's copy off the GPU waits for
the event its own step recorded, not for everything launched until the step that queues it.

Real: vLLM's scheduler and its scheduler-side connector, the worker-side connector (vLLM's
factory), `basic_cache`, the connector's read and write, our patches. Stand-ins: CUDA streams
and events, which here log what waits for what."""

from __future__ import annotations

import contextlib
import importlib
from typing import Any

import pytest
import torch
from conftest import engine_config, needs
from upstream_worker import CONNECTOR, CpuTorch, extract, extraction, load, storage, without

from speculators_hybrid import planning
from speculators_hybrid.vllm_patches import copy_ready

pytestmark = needs("hidden-states-copy-when-ready")


class Log:
    """Streams and events that remember: which stream each event marks, what each stream waits
    for, and when (a running count of calls)."""

    def __init__(self) -> None:
        self.current: list[Any] = ["compute"]  # the stream work goes to now
        self.recorded: dict[int, tuple[Any, int]] = {}  # event -> (stream, at)
        self.waits: list[tuple[Any, int]] = []  # (stream, event)
        self.clock = 0
        self.step_events: list[int] = []  # events recorded on the compute stream, in order
        self.alive: list[Any] = []  # every event, so that no id is reused


def recording_cuda(log: Log) -> Any:
    """upstream_worker's CPU stand-ins, with records and waits logged."""
    stand_in: Any = CpuTorch.cuda

    class Event(stand_in.Event):
        def record(self, stream: Any = None) -> None:
            log.clock += 1
            log.alive.append(self)
            where = stream if stream is not None else log.current[-1]
            log.recorded[id(self)] = (where, log.clock)
            if where == "compute":
                log.step_events.append(id(self))

    class Stream(stand_in.Stream):
        def wait_event(self, event: Any) -> None:
            log.alive.append(event)
            log.waits.append((self, id(event)))

    class Cuda:
        pass

    Cuda.Event = Event  # type: ignore[attr-defined]
    Cuda.Stream = Stream  # type: ignore[attr-defined]

    @contextlib.contextmanager
    def stream(s: Any):
        log.current.append(s)
        try:
            yield
        finally:
            log.current.pop()

    Cuda.stream = staticmethod(stream)  # type: ignore[attr-defined]
    return Cuda


@pytest.fixture
def log(monkeypatch: pytest.MonkeyPatch) -> Log:
    log = Log()
    cuda = recording_cuda(log)

    class Torch(CpuTorch):
        pass

    Torch.cuda = cuda  # type: ignore[assignment]
    monkeypatch.setattr(importlib.import_module(CONNECTOR), "torch", Torch())
    monkeypatch.setattr(copy_ready, "_cuda", lambda: cuda)
    return log


def setup(tmp_path):
    config = engine_config(preset="tiny", ids=(2, 5, 8), max_model_len=4096)
    storage(config, tmp_path)
    return config, planning.plan(config, planning.layer_specs(config), 64 << 20)


def ready_for_copy(log: Log, copy_stream: Any) -> tuple[int, int]:
    """(event, when it was recorded) on the compute stream that the copy stream's last copy
    waits for: directly, or through a stream that waited for it (the plugin's form)."""
    stream, ready = [w for w in log.waits if w[0] is copy_stream][-1]
    where, at = log.recorded[ready]
    if where != "compute":
        ready = [event for s, event in log.waits if s is where][-1]
        where, at = log.recorded[ready]
    assert where == "compute"
    return ready, at


def timed_get_finished(log: Log, worker: Any, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """When (the log's clock) each call of the worker's get_finished started."""
    started: list[int] = []
    inner = worker.get_finished

    def get_finished(*args: Any, **kwargs: Any) -> Any:
        started.append(log.clock)
        return inner(*args, **kwargs)

    monkeypatch.setattr(worker, "get_finished", get_finished)
    return started


def test_the_copy_waits_for_its_own_steps_event(shim, tmp_path, log, monkeypatch):
    config, kv = setup(tmp_path)
    with extraction(config, kv) as ex:
        queued = timed_get_finished(log, ex.worker, monkeypatch)
        path = extract(ex, "req-1", torch.randn(40, 3, 256))["hidden_states_path"]
        data = load(path)
        event, at = ready_for_copy(log, ex.worker._get_copy_stream())
    assert data["token_ids"].tolist() == list(range(1, 41))
    # Recorded at req-1's own step (its wait_for_save), before the step that queued the copy.
    assert at <= queued[-1] and event == log.step_events[0]


def test_each_request_waits_for_the_step_that_computed_it(shim, tmp_path, log, monkeypatch):
    config, kv = setup(tmp_path)
    with extraction(config, kv) as ex:
        queued = timed_get_finished(log, ex.worker, monkeypatch)
        copies = []
        for req_id, tokens in (("req-1", 20), ("req-2", 30)):
            extract(ex, req_id, torch.randn(tokens, 3, 256))
            copies.append(ready_for_copy(log, ex.worker._get_copy_stream()))
    (first, at1), (second, at2) = copies
    assert first != second and at1 <= queued[0] < at2 <= queued[1]


def test_the_step_metadata_lists_the_requests_it_computes(shim, tmp_path, log):
    config, kv = setup(tmp_path)
    with extraction(config, kv) as ex:
        ex.scheduler.add_request(ex.request("req-1", list(range(1, 17))))
        out = ex.scheduler.schedule()
        assert list(out.kv_connector_metadata.scheduled_req_ids) == ["req-1"]


def test_without_the_patch_the_copy_waits_for_everything_launched(shim, tmp_path, log, monkeypatch):
    config, kv = setup(tmp_path)
    with without("hidden-states-copy-when-ready"), extraction(config, kv) as ex:
        queued = timed_get_finished(log, ex.worker, monkeypatch)
        extract(ex, "req-1", torch.randn(40, 3, 256))
        _, at = ready_for_copy(log, ex.worker._get_copy_stream())
    assert at > queued[-1]  # marked as the copy was queued, after that step's launches


def test_events_of_requests_that_write_no_file_do_not_pile_up(log):
    ready = copy_ready.ReadyEvents()
    ready.step_done(["aborted"])  # its copy is never queued
    for step in range(3 * ready.KEEP):
        ready.step_done([f"req-{step}"])
        assert ready.waiting_stream(f"req-{step}") is not None  # its own event, one step on
    assert "aborted" not in ready.events and len(log.step_events) == 3 * ready.KEEP + 1


def test_a_copy_queued_after_its_event_was_let_go_waits_as_vllm_makes_it(log):
    ready = copy_ready.ReadyEvents()
    ready.step_done(["late"])
    for _ in range(ready.KEEP):
        ready.step_done([])
    assert ready.waiting_stream("late") is None
