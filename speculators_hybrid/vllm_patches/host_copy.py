"""Device-to-host copies of hidden-state files, paced so that vLLM's own small copies never
queue behind them (our connector's writes off the step, vLLM < 0.22).

Why: vLLM's step copies a few bytes to the host and waits for them (indices, counts). Issued
as one step's file copies start, such a copy waits behind them (whole, or cut into pieces queued
at once: benchmarks/copy_queue.py), and the GPU idles that long while the host waits: the
largest gaps of the real-size profile (benchmarks/results/README.md).
How: one thread per GPU queues the files' copies in pieces of `SPECULATORS_HYBRID_COPY_CHUNK_MIB`
(SUGGESTED_MIB suggested), at most WINDOW pieces at a time, so a small copy waits for two pieces
at most. Off by default (0: each tensor queued whole from the step): at the real size it wrote
the same bytes at the same speed (benchmarks/results/README.md, paced host copies).
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from speculators_hybrid import switches

if TYPE_CHECKING:
    import torch

CHUNK_MIB = 0  # measured: no gain end to end (module docstring)
SUGGESTED_MIB = 2
WINDOW = 2  # pieces queued at once: one copying, one ready to start


def chunk_bytes() -> int:
    """Bytes a piece from the variable (MiB, 0 = whole tensors, unpaced), else 0 (unpaced)."""
    raw = os.environ.get(switches.COPY_CHUNK_MIB, "").strip() or str(CHUNK_MIB)
    try:
        mib = float(raw)
    except ValueError:
        mib = -1.0
    if not 0 <= mib < 1 << 20:
        raise ValueError(
            f"{switches.COPY_CHUNK_MIB} must be a number of MiB from 0 (unpaced) "
            f"to under 1048576, got {raw!r}"
        )
    return int(mib * (1 << 20))


def pieces(dst: torch.Tensor, src: torch.Tensor, nbytes: int) -> Iterator[tuple[Any, Any]]:
    """(dst, src) views covering both tensors in order, at most `nbytes` each (whole if 0 or
    when either is not contiguous)."""
    if not nbytes or not (dst.is_contiguous() and src.is_contiguous()) or src.numel() == 0:
        yield dst, src
        return
    flat_dst, flat_src = dst.reshape(-1), src.reshape(-1)
    step = max(1, nbytes // src.element_size())
    for start in range(0, src.numel(), step):
        yield flat_dst[start : start + step], flat_src[start : start + step]


class Window:
    """At most `size` pieces queued: before the next, wait for the oldest (a ring of events)."""

    def __init__(self, size: int, new_event: Callable[[], Any]) -> None:
        self._events = [new_event() for _ in range(size)]
        self._used = [False] * size
        self._next = 0

    def before_piece(self) -> None:
        if self._used[self._next]:
            self._events[self._next].synchronize()

    def after_piece(self, stream: Any) -> None:
        self._events[self._next].record(stream)
        self._used[self._next] = True
        self._next = (self._next + 1) % len(self._events)


class PacedCopier:
    """Copies tensors into pinned host memory from a thread of its own, piece by piece."""

    def __init__(self, device: Any, nbytes: int, window: int = WINDOW) -> None:
        import torch

        self._device = device
        self._nbytes = nbytes
        self._stream = torch.cuda.Stream(device=device)
        with torch.cuda.device(device):
            self._window = Window(window, lambda: torch.cuda.Event(blocking=True))
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        threading.Thread(target=self._run, name="speculators-hybrid-copy", daemon=True).start()

    def submit(self, tensors: dict[str, torch.Tensor]) -> Future[tuple[dict, Any]]:
        """Queue host copies of `tensors` after what the current stream has queued (the
        gather). The future gives the host tensors and the event that marks them copied."""
        import torch

        after = torch.cuda.Event()
        after.record(torch.cuda.current_stream(self._device))
        for tensor in tensors.values():
            if tensor.is_cuda:
                tensor.record_stream(self._stream)  # the rows stay until their copy is done
        done: Future[tuple[dict, Any]] = Future()
        self._jobs.put((tensors, after, done))
        return done

    def _run(self) -> None:
        import torch

        with torch.cuda.device(self._device), torch.cuda.stream(self._stream):
            while True:
                tensors, after, done = self._jobs.get()
                try:
                    done.set_result(self._copy(tensors, after))
                except BaseException as exc:  # noqa: BLE001 (the writer reports it per file)
                    done.set_exception(exc)
                del tensors, after, done  # the GPU rows go once queued, not with the next job

    def _copy(self, tensors: dict[str, torch.Tensor], after: Any) -> tuple[dict, Any]:
        import torch

        self._stream.wait_event(after)
        host = {}
        for key, tensor in tensors.items():
            if not tensor.is_cuda:
                host[key] = tensor
                continue
            host[key] = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            for dst, src in pieces(host[key], tensor, self._nbytes):
                self._window.before_piece()
                dst.copy_(src, non_blocking=True)
                self._window.after_piece(self._stream)
        ready = torch.cuda.Event(blocking=True)
        ready.record(self._stream)
        return host, ready


_COPIERS: dict[tuple[Any, int], PacedCopier] = {}  # (device, piece bytes) -> its copier
_COPIERS_LOCK = threading.Lock()


def copier(device: Any, nbytes: int) -> PacedCopier:
    with _COPIERS_LOCK:
        key = (device, nbytes)
        if key not in _COPIERS:
            _COPIERS[key] = PacedCopier(device, nbytes)
        return _COPIERS[key]
