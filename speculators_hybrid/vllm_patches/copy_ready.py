"""Each file's copy off the GPU waits for its request's own step, not a later one (vLLM >= 0.24).

Why: vLLM's hidden-states connector queues a finished request's copy to the host in a later
step's `get_finished`, after that step's forward is launched, and makes the copy wait for all
work launched so far: with async scheduling (vLLM 0.25.0's runner and engine loop, read) a
step's files are copied only once the next step but one has run, so at the end of a batch up
to three steps' files are copied and written after `generate` returns, with nothing left on the
GPU to hide them behind.
How: the scheduler's connector lists, with each step's metadata, the requests that step
computes; the worker's `wait_for_save`, which vLLM calls once the step's work (the draft
model's included) is launched, records a CUDA event there for those requests. When a
request's copy is queued, it waits for that event only (on a stream of its own that vLLM's copy
stream then waits for), so it runs beside the steps after it. A request with no event (none
recorded yet) waits as vLLM makes it wait.
Effect: with files complete, extraction runs closer to plain prefill than with the patch off,
side by side (benchmarks/results/README.md).
Upstream: none yet.
"""

from __future__ import annotations

from typing import Any

from speculators_hybrid.registry import Patch, Target, argument, state_on
from speculators_hybrid.vllm_patches._targets import BUILD_META, SUBMIT_ASYNC_WRITE, WAIT_FOR_SAVE
from speculators_hybrid.vllm_patches._targets import STOCK_CONNECTOR as CONNECTOR

SCHEDULED = "scheduled_req_ids"  # on the step's metadata: the requests it computes
STATE = "_speculators_hybrid_copy_ready"  # per worker connector


def _cuda() -> Any:
    import torch

    return torch.cuda


class ReadyEvents:
    """Per worker connector: the event each request's last step recorded, and a stream that
    waits for one of them while vLLM queues the copy. The one stream keeps every wait it was
    given, so a copy queued after a later request's waits for that one's step too: never
    longer than vLLM's own wait, for all work launched. A request that ends with no file
    (aborted, refused) leaves its event: it goes once KEEP steps have passed, and a copy queued
    later than that waits as vLLM makes it wait."""

    KEEP = 16  # steps; vLLM queues a copy at most two steps after its request's own

    def __init__(self) -> None:
        self.events: dict[str, tuple[int, Any]] = {}  # req_id -> (step, event)
        self.step = 0
        self.stream: Any = None

    def step_done(self, req_ids: Any) -> None:
        self.step += 1
        if req_ids:
            event = _cuda().Event()
            event.record()  # after the step's work on the current (compute) stream
            for req_id in req_ids:
                self.events[req_id] = (self.step, event)
        if self.step % self.KEEP == 0:
            oldest = self.step - self.KEEP
            self.events = {r: e for r, e in self.events.items() if e[0] > oldest}

    def waiting_stream(self, req_id: str) -> Any:
        """A stream whose position is the request's event, or None if it has none."""
        step, event = self.events.pop(req_id, (0, None))
        if event is None or step <= self.step - self.KEEP:
            return None
        cuda = _cuda()
        if self.stream is None:
            self.stream = cuda.Stream()
        self.stream.wait_event(event)
        return self.stream


def _state(connector: Any) -> ReadyEvents:
    return state_on(connector, STATE, ReadyEvents)


def _build_meta(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    meta = wrapped(*args, **kwargs)
    scheduler_output = argument(args, kwargs, 0, "scheduler_output")
    setattr(meta, SCHEDULED, list(scheduler_output.num_scheduled_tokens))
    return meta


def _wait_for_save(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    result = wrapped(*args, **kwargs)
    if instance._is_tp_rank_zero and instance.has_connector_metadata():
        _state(instance).step_done(getattr(instance._get_connector_metadata(), SCHEDULED, ()))
    return result


def _submit(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    pending = argument(args, kwargs, 0, "pending")
    stream = _state(instance).waiting_stream(pending.req_id)
    if stream is None:
        return wrapped(*args, **kwargs)
    with _cuda().stream(stream):  # vLLM marks "ready" on the current stream: here, the event
        return wrapped(*args, **kwargs)


PATCH = Patch(
    id="hidden-states-copy-when-ready",
    project="vllm",
    versions=">=0.24",
    fixed_upstream="none yet",
    why=__doc__ or "",
    targets=(
        Target(
            CONNECTOR,
            "ExampleHiddenStatesConnector.build_connector_meta",
            _build_meta,
            BUILD_META,
        ),
        Target(
            CONNECTOR,
            "ExampleHiddenStatesConnector.wait_for_save",
            _wait_for_save,
            WAIT_FOR_SAVE,
        ),
        Target(
            CONNECTOR,
            "ExampleHiddenStatesConnector._submit_async_write",
            _submit,
            SUBMIT_ASYNC_WRITE,
        ),
    ),
)
