"""Hidden-state files written off the engine step (our connector, vLLM < 0.22): the default.

Why: a file written inside the engine step (copy to the host, serialize, write) holds
extraction well below plain prefill at the real size (benchmarks/results/README.md).
How: the step only gathers the rows on the GPU, queues their copy into pinned host memory
and takes `<path>.lock`; a thread waits for the copy, writes the file aside, renames it into
place and releases the lock, as vLLM >= 0.22's own connector does.
Who may read: a reader that waits on the lock (speculators >= 0.6, `vllm.LLM` through
llm_wait.py) sees a whole file or none. speculators 0.5.0 reads without waiting, so
`speculators-hybrid launch` turns these writes off where it is installed; by hand:
`kv_connector_extra_config["async_writes"] = false` or `SPECULATORS_HYBRID_ASYNC_WRITES=0`.
The opt-in guard against bad rows keeps the in-step write (its verdict must be known before
the request finishes). Threads: 8, or `kv_connector_extra_config["num_writer_threads"]` (vLLM
>= 0.22's key for its own writer) or `SPECULATORS_HYBRID_WRITER_THREADS`.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
from collections import OrderedDict, deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import IO, TYPE_CHECKING, Any

from speculators_hybrid import switches
from speculators_hybrid.hidden_files import REJECTED, leave_marker
from speculators_hybrid.vllm_patches import host_copy
from speculators_hybrid.vllm_patches.provenance_meta import save_whole

if TYPE_CHECKING:  # importable without torch: the launcher reads its settings
    import torch

logger = logging.getLogger("vllm.speculators_hybrid")

ASYNC_KEY = "async_writes"  # in kv_connector_extra_config
THREADS_KEY = "num_writer_threads"  # in kv_connector_extra_config (vLLM >= 0.22's own key)
THREADS = 8  # as vLLM >= 0.22's writer: the last step's files are written side by side


def async_enabled(extra_config: Any) -> bool:
    """On unless `async_writes` is false in the extra config or the variable is 0/false/no."""
    if switches.off(switches.ASYNC_WRITES):
        return False
    return str(extra_config(ASYNC_KEY, True)).strip().lower() not in switches.OFF


def writer_threads(extra_config: Any) -> int:
    """Writer threads: the variable, else `num_writer_threads` in the extra config, else 8."""
    raw = os.environ.get(switches.WRITER_THREADS) or extra_config(THREADS_KEY, THREADS)
    try:
        threads = int(raw)
    except (TypeError, ValueError):
        threads = 0
    if threads < 1:
        raise ValueError(
            f"{switches.WRITER_THREADS} / kv_connector_extra_config['{THREADS_KEY}'] "
            "must be a whole number "
            f">= 1, got {raw!r}"
        )
    return threads


class FileWriter:
    """Writes files from writer threads; at most `max_pending` wait, then `submit` blocks."""

    def __init__(self, threads: int = THREADS, max_pending: int = 64) -> None:
        self._chunk_bytes = host_copy.chunk_bytes()  # 0: copies queued whole from the step
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="speculators-hybrid-writer")
        self._pending: deque[Future[None]] = deque()
        self._max_pending = max_pending

    def submit(
        self,
        path: str,
        tensors: dict[str, torch.Tensor],
        metadata: dict[str, str] | None,
        fmt: str | None = None,
    ) -> None:
        """Lock `path` now (readers wait from here on), copy to the host, write in a thread
        (encoded as `fmt` asks: fp8_files.encode)."""
        lock = open(f"{path}.lock", "a")  # noqa: SIM115 (closed by the writer thread)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            copied = _to_host(tensors, self._chunk_bytes)
            while len(self._pending) >= self._max_pending:
                self._pending.popleft().result()
            self._pending.append(self._pool.submit(_write, path, copied, metadata, lock, fmt))
        except BaseException:
            lock.close()  # never leave a reader waiting on a lock no writer will release
            raise
        while self._pending and self._pending[0].done():
            self._pending.popleft().result()

    def drain(self) -> None:
        """Wait until every submitted file is written (or its write failed and was logged)."""
        while self._pending:
            self._pending.popleft().result()

    def shutdown(self) -> None:
        self.drain()
        self._pool.shutdown(wait=True)


_COPY_STREAMS: dict[Any, Any] = {}  # device -> the stream host copies run on


def _copy_stream(device: Any) -> Any:
    import torch

    if device not in _COPY_STREAMS:
        _COPY_STREAMS[device] = torch.cuda.Stream(device=device)
    return _COPY_STREAMS[device]


def _to_host(tensors: dict[str, torch.Tensor], chunk_bytes: int) -> Future[tuple[dict, Any]]:
    """Host copies (pinned) and the event that marks them done, once queued.

    Paced (host_copy.py) unless `chunk_bytes` is 0; then queued here whole, on a stream of their
    own, after what the current stream has queued (the gather), so the next forward does not
    wait behind about 84 MB per 2,048-token file; `record_stream` keeps the gathered rows'
    memory from reuse until their copy is done.
    """
    import torch

    copied: Future[tuple[dict, Any]] = Future()
    on_gpu = [t for t in tensors.values() if t.is_cuda]
    if not on_gpu:
        copied.set_result((dict(tensors), None))
        return copied
    if chunk_bytes:
        return host_copy.copier(on_gpu[0].device, chunk_bytes).submit(tensors)
    stream = _copy_stream(on_gpu[0].device)
    stream.wait_stream(torch.cuda.current_stream(on_gpu[0].device))
    host = {}
    with torch.cuda.stream(stream):
        for key, tensor in tensors.items():
            if tensor.is_cuda:
                host[key] = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
                host[key].copy_(tensor, non_blocking=True)
                tensor.record_stream(stream)
            else:
                host[key] = tensor
        ready = torch.cuda.Event(blocking=True)  # the writer thread sleeps, does not spin
        ready.record(stream)
    copied.set_result((host, ready))
    return copied


def _write(
    path: str,
    copied: Future[tuple[dict, Any]],
    metadata: Any,
    lock: IO[str],
    fmt: str | None = None,
) -> None:
    from speculators_hybrid.vllm_patches.fp8_files import encode

    try:
        host, ready = copied.result()
        if ready is not None:
            ready.synchronize()
        save_whole(path, encode(host, fmt), metadata)
    except Exception as exc:  # noqa: BLE001 (the reader gets the lock, finds no file, fails)
        report_failure(path, exc)
    finally:
        lock.close()  # releases the reader's wait


# Failed writes, for the scheduler side of the same process (TP=1: the worker runs in the
# engine core) to turn into the request's `hidden_states_error`; bounded, as a worker in another
# process records entries nobody takes.
_failures: OrderedDict[str, str] = OrderedDict()
_failures_lock = threading.Lock()
MAX_FAILURES = 4096


def report_failure(path: str, exc: BaseException, record: bool = False) -> str:
    """Log why `path` was not written, leave `<path>.rejected` saying so if the folder takes it,
    and with `record` keep it for `take_failure`. Returns the reason."""
    reason = f"could not write {path}: {_cause(exc)}"
    logger.error("speculators-hybrid: %s", reason, exc_info=not isinstance(exc, OSError))
    if record:
        with _failures_lock:
            _failures[path] = reason
            while len(_failures) > MAX_FAILURES:
                _failures.popitem(last=False)
    leave_marker(path, reason)  # where the folder takes none, the log line (and record) say it
    return reason


def _cause(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if isinstance(exc, OSError) else f"{type(exc).__name__}: {text}"


def clear_failure(path: str) -> None:
    """Forget an earlier failure of `path` (a request id used again) before writing it anew."""
    with _failures_lock:
        _failures.pop(path, None)
    try:
        os.unlink(f"{path}{REJECTED}")
    except OSError:
        pass  # none (the usual case), or the write that follows will say what is wrong


def take_failure(path: str) -> str | None:
    """Why `path` was not written, if its writer said so (in this process or in the marker)."""
    with _failures_lock:
        reason = _failures.pop(path, None)
    if reason is not None:
        return reason
    try:
        with open(f"{path}{REJECTED}") as marker:
            return marker.read()
    except OSError:
        return None
