"""A folder that takes no file fails one request, not the engine (vLLM >= 0.24).

Why: vLLM's hidden-states connector makes each request's `<path>.lock` in the worker's
`wait_for_save`, and the folder (and a lock, if none was made) again when it queues the write
(`_submit_async_write`). On a read-only, immutable or vanished-and-unmakeable folder
(`OSError`: EROFS, EPERM, EACCES, ENOSPC for the inode) either raises out of the worker's step
and stops the engine for every request.
How: when `wait_for_save` raises an `OSError`, the request whose lock it could not make (the
first of the step's new requests without one) is dropped from that step's new files, the cause
is logged with the path, and the rest get their locks; a write that cannot be queued for that
cause is skipped the same way (its lock, if any, released). The response already named the path
(vLLM returns it before writing): the reader finds no lock and no file. Later requests are
written as soon as the folder takes files again.
Upstream: none yet.
"""

from __future__ import annotations

import os
from typing import Any

from speculators_hybrid.registry import Patch, Target, argument, state_on
from speculators_hybrid.vllm_patches._targets import STOCK_CONNECTOR as CONNECTOR
from speculators_hybrid.vllm_patches._targets import SUBMIT_ASYNC_WRITE, WAIT_FOR_SAVE
from speculators_hybrid.vllm_patches.writer import report_failure

REFUSED = "_speculators_hybrid_refused"  # per connector: requests whose file cannot be made


def _refused(connector: Any) -> set[str]:
    return state_on(connector, REFUSED, set)


def _first_without_lock(connector: Any) -> tuple[str, str] | None:
    """The step's first new request that has no lock yet: the one vLLM's loop stopped at."""
    new = getattr(connector._get_connector_metadata(), "new_req_filenames", {})
    return next(((r, f) for r, f in new.items() if r not in connector._lock_fds), None)


def _wait_for_save(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    while True:
        try:
            return wrapped(*args, **kwargs)
        except OSError as exc:
            failed = _first_without_lock(instance)
            if failed is None:
                raise
            req_id, filename = failed
            del instance._get_connector_metadata().new_req_filenames[req_id]
            _refused(instance).add(req_id)
            report_failure(filename, exc)


def _submit(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    pending = argument(args, kwargs, 0, "pending")
    refused = _refused(instance)
    if pending.req_id in refused:
        refused.discard(pending.req_id)
        return None
    try:
        return wrapped(*args, **kwargs)
    except OSError as exc:
        lock_fd = instance._lock_fds.pop(pending.req_id, None)
        if lock_fd is not None:
            os.close(lock_fd)  # a reader waiting on it gets it at once, and no file
        report_failure(pending.filename, exc)
        return None


PATCH = Patch(
    id="hidden-states-folder-faults",
    project="vllm",
    versions=">=0.24",
    fixed_upstream="none yet",
    why=__doc__ or "",
    targets=(
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
