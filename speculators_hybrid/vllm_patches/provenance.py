"""Provenance and the opt-in guard for files vLLM's own connector writes (vLLM >= 0.22).

Why: from vLLM 0.22 hybrid targets use upstream's `ExampleHiddenStatesConnector` unchanged;
its files carry no metadata, so `speculators-hybrid check` cannot tell who wrote them (a
vLLM 0.24.x file with or without `hidden-states-read-slots`), and nothing stops a file of
zeros or NaN from reaching training (speculators issue 613).
How: the one function that writes a file, `_write_tensors` (run in the connector's writer
threads once the copy to the host is done), writes the same provenance metadata as our
connector for vLLM < 0.22, and, with the guard on (`refuse_bad_hidden_states` in
`kv_connector_extra_config` or `SPECULATORS_HYBRID_REFUSE_BAD=1`), leaves `<path>.rejected`
instead of a file with NaN/Inf or all-zero token rows. The file is written aside and renamed
into place; the lock is released as upstream releases it. Upstream hands the path to the
client when the request finishes, before the file is checked (0.24+ write it a step later,
0.22-0.23 in a writer thread), so unlike our connector the request cannot carry
`hidden_states_error`: the reader waits on the lock, then finds no file and fails.
Upstream: none (upstream writes no metadata).
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from typing import Any

from speculators_hybrid.registry import Patch, Target, argument
from speculators_hybrid.vllm_patches._targets import STOCK_CONNECTOR as CONNECTOR
from speculators_hybrid.vllm_patches.fp8_files import encode, file_format
from speculators_hybrid.vllm_patches.provenance_meta import (
    bad_rows,
    guard_enabled,
    provenance,
    refuse,
    save_whole,
)

logger = logging.getLogger("vllm.speculators_hybrid")


Settings = tuple[dict[str, str] | None, bool, str | None]  # metadata, guard, file format
# Per connector, made once: hashing the model config for every file cost writer-thread GIL time.
_settings: weakref.WeakKeyDictionary[Any, Settings] = weakref.WeakKeyDictionary()
_settings_lock = threading.Lock()  # the writer threads of one connector start together


def writer_settings() -> Settings:
    """(metadata, guard on, file format) for this worker, from the connector vLLM set up in
    it."""
    from vllm.distributed.kv_transfer.kv_transfer_state import (
        get_kv_transfer_group,
        has_kv_transfer_group,
    )

    if not has_kv_transfer_group():
        return None, guard_enabled(lambda key, default: default), None
    connector = get_kv_transfer_group()
    with _settings_lock:
        if (known := _settings.get(connector)) is not None:
            return known
        extra = connector._kv_transfer_config.get_from_extra_config
        guard, fmt = guard_enabled(extra), file_format(extra)
        try:
            settings: Settings = (provenance(connector._vllm_config), guard, fmt)
        except Exception as exc:  # noqa: BLE001 (never lose the data for its label)
            logger.warning("speculators-hybrid: no provenance for hidden-state files: %r", exc)
            settings = (None, guard, fmt)
        _settings[connector] = settings
        return settings


def _write_with_provenance(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> None:
    tensors = argument(args, kwargs, 0, "tensors")
    event = argument(args, kwargs, 1, "event")
    path = argument(args, kwargs, 2, "filename")
    lock_fd = argument(args, kwargs, 3, "lock_fd")
    try:
        event.synchronize()  # the copy to host memory is done
        metadata, guard, fmt = writer_settings()
        problem = bad_rows(tensors["hidden_states"]) if guard else None
        if problem is not None:
            refuse(path, problem)
        else:
            save_whole(path, encode(tensors, fmt), metadata)  # fp8 for hidden-states-fp8-files
    finally:
        if lock_fd is not None:
            os.close(lock_fd)  # releases the reader's wait


PATCH = Patch(
    id="hidden-states-provenance",
    project="vllm",
    versions=">=0.22",
    fixed_upstream="none (upstream writes no metadata)",
    why=__doc__ or "",
    targets=(
        Target(
            CONNECTOR,
            "ExampleHiddenStatesConnector._write_tensors",
            _write_with_provenance,
            # The same code in every release 0.22.0-0.34.0.
            ("ce3411c23a4b53e5",),
        ),
    ),
)
