"""File names that stay inside the hidden-states folder, whatever the request id (vLLM >= 0.22).

Why: both connectors named the file `{shared_storage_path}/{req_id}.safetensors` with
`os.path.join`, and the request id can come from the client (`vllm serve` takes `X-Request-Id`
into it; `LLM`/`AsyncLLM` callers pass their own). An id such as `../../home/u/.bashrc` or
`/etc/cron.d/x` put the file (and its `.lock`) outside the folder (an absolute id replaces the
folder altogether; vLLM >= 0.24 also `makedirs` the id's directories); one with a NUL byte or
5,000 characters failed in the worker's `open` (ValueError, ENAMETOOLONG) and took the engine
down.
How: `file_stem(req_id)` keeps an ordinary id as it is (vLLM's own `cmpl-...-0-1a2b3c4d`, any id
of at most 160 characters from `A-Z a-z 0-9 . _ -` that starts with a letter, digit or `_`);
any other id becomes its characters with each one outside that set as `_`, cut to 48 and
stripped of leading dots and dashes, then `+` and 32 hex digits of the SHA-256 of the whole id
(UTF-8). `+` never occurs in an ordinary name, so a hashed name cannot equal one. The path is
returned in `kv_transfer_params["hidden_states_path"]` as before, so a client reads the file
from where the server put it; `file_stem` also tells the name from the id offline. Our connector
(vLLM < 0.22) builds its paths with it; on vLLM >= 0.22 `build_connector_meta` of vLLM's
`ExampleHiddenStatesConnector` gets the same names (a client path allowed by
`allow_custom_save_path` is upstream's opt-in for trusted clients and stays as given).
Leftovers: a file is written in a folder of its own, `<path>.<pid>.part/`, and renamed out of
it (provenance_meta.save_whole); a server killed mid-write leaves that folder behind.
`sweep(folder)` removes such parts when the connector starts (worker side) if no writer holds
`<path>.lock` (or, with no lock file, the part is 10 minutes old), so servers sharing a folder
never delete each other's writes in flight.
Upstream: none yet (vLLM's connector uses the raw id).
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import re
import shutil
import time
from typing import Any

from speculators_hybrid.registry import Patch, Target, argument
from speculators_hybrid.vllm_patches._targets import BUILD_META, BUILD_META_BEFORE_024
from speculators_hybrid.vllm_patches._targets import STOCK_CONNECTOR as CONNECTOR

logger = logging.getLogger("vllm.speculators_hybrid")

ORDINARY = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,159}")
UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
READABLE = 48  # characters of the id kept in a hashed name
DIGEST = 32  # hex digits of SHA-256 (128 bits)
SUFFIX = ".safetensors"
PART = re.compile(r"(?P<final>.+\.safetensors)\.\d+\.part")
STALE_S = 600.0  # a part without a lock file this old has no writer


def file_stem(req_id: str) -> str:
    """The file name (without `.safetensors`) for a request id: the id, or a safe hashed form."""
    if ORDINARY.fullmatch(req_id):
        return req_id
    digest = hashlib.sha256(req_id.encode("utf-8", "surrogatepass")).hexdigest()[:DIGEST]
    readable = UNSAFE.sub("_", req_id[:READABLE]).lstrip(".-")
    return f"{readable}+{digest}"


def hidden_states_path(folder: str, req_id: str) -> str:
    """`{folder}/{file_stem(req_id)}.safetensors`: always a file directly in `folder`."""
    return os.path.join(folder, file_stem(req_id) + SUFFIX)


def sweep(folder: str) -> list[str]:
    """Remove the `.part` files of writers that are gone; the paths removed."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []  # no folder yet (made at the first write), or unreadable: nothing to sweep
    removed = []
    for entry in entries:
        found = PART.fullmatch(entry.name)
        if found is None or entry.is_symlink():
            continue
        if _writer_gone(os.path.join(folder, found["final"]), entry):
            try:
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path)
                else:  # an aside file (speculators-hybrid before the aside folder)
                    os.unlink(entry.path)
                removed.append(entry.path)
            except FileNotFoundError:
                pass  # another worker swept it first
            except OSError as exc:
                logger.warning("speculators-hybrid: cannot remove leftover %s: %s", entry.path, exc)
    if removed:
        logger.warning(
            "speculators-hybrid: removed %d partial hidden-state file(s) left by a killed "
            "writer in %s (e.g. %s)",
            len(removed),
            folder,
            removed[0],
        )
    return removed


def _writer_gone(final: str, part: os.DirEntry) -> bool:
    try:
        fd = os.open(f"{final}.lock", os.O_RDONLY)
    except FileNotFoundError:  # no lock (use_synchronization_lock off): by age
        try:
            return time.time() - part.stat(follow_symlinks=False).st_mtime > STALE_S
        except OSError:
            return False
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True  # nobody writes under this lock; closing the fd releases it
    except OSError:
        return False  # a live writer holds it
    finally:
        os.close(fd)


# ---- vLLM >= 0.22: vLLM's own ExampleHiddenStatesConnector ----


def _safe_names(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    meta = wrapped(*args, **kwargs)
    output = argument(args, kwargs, 0, "scheduler_output")
    folder = instance._storage_path
    renamed = {}
    for new in output.scheduled_new_reqs:
        stock = os.path.join(folder, f"{new.req_id}{SUFFIX}")
        safe = hidden_states_path(folder, new.req_id)
        if safe != stock and instance._request_filenames.get(new.req_id) == stock:
            renamed[new.req_id] = safe  # a client path (allow_custom_save_path) stays
    if not renamed:
        return meta
    instance._request_filenames.update(renamed)
    names = getattr(meta, "new_req_filenames", None)  # 0.24+: the worker's lock files
    if names is not None:
        names.update({r: p for r, p in renamed.items() if r in names})
    for request in getattr(meta, "requests", ()):  # 0.22-0.23: the worker's saves
        if request.req_id in renamed:
            request.filename = renamed[request.req_id]
    return meta


def _sweep_at_start(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    result = wrapped(*args, **kwargs)
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    if argument(args, kwargs, 1, "role") == KVConnectorRole.WORKER:
        sweep(str(instance._storage_path))
    return result


PATCH = Patch(
    id="hidden-states-safe-file-names",
    project="vllm",
    versions=">=0.22",
    fixed_upstream="none yet (vLLM's connector uses the raw request id)",
    why=__doc__ or "",
    targets=(
        Target(
            CONNECTOR,
            "ExampleHiddenStatesConnector.build_connector_meta",
            _safe_names,
            (*BUILD_META_BEFORE_024, *BUILD_META),
        ),
        Target(
            CONNECTOR,
            "ExampleHiddenStatesConnector.__init__",
            _sweep_at_start,
            # 0.22.0-0.23.0; 0.24.0; 0.25.0-0.34.0
            ("a9e337fcf9a29772", "52cc2ba901e2ddad", "d46bf6b85f5b3f77"),
        ),
    ),
)
