"""A safetensors file read with numpy alone (no torch): header, metadata and row slices; and
`write`, which writes one from torch tensors in host memory with the GIL free for the bytes.

The format: 8 bytes, the little-endian length N of a JSON header; the header, tensor name ->
dtype, shape and `data_offsets` [begin, end) into the data after it, plus `__metadata__`; the
data. `check` reads hidden-state files through this so it starts in well under a second (torch
is slow to import), reads rows as memory-mapped slices, and says plainly what is wrong with a
file that is not safetensors or is cut short. bfloat16 and the float8 formats, which numpy
lacks, come back as float32 (exactly: every value of them is a float32 value).

Why `write` and not safetensors' `save_file`: the writer threads of a vLLM engine share the GIL
with its engine thread, and `save_file` holds it while it serialises in releases before 0.8, so
the engine thread, which launches the GPU's work, waits for each file. `write` builds the
header in Python and hands it and the tensors' own memory to one `writev(2)`, which runs without
the GIL. The other way round, every call that lets the GIL go (a syscall, a torch op) makes the
writer wait to get it back while the engine thread runs Python, so `write` makes few (no torch
op on a contiguous CPU tensor, one `writev` a file). On a small CPU beside a busy Python thread
the difference is within the noise (benchmarks/results/, the writer-busy-gil run); the GPU
host's tail after `generate` returns is where it counts.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import struct
from typing import Any

import numpy as np

NUMPY = {
    "F64": "<f8",
    "F32": "<f4",
    "F16": "<f2",
    "BF16": "<u2",  # widened to float32 on read
    "F8_E4M3": "u1",  # via FLOAT8 tables
    "F8_E5M2": "u1",
    "I64": "<i8",
    "I32": "<i4",
    "I16": "<i2",
    "I8": "i1",
    "U8": "u1",
    "U16": "<u2",
    "U32": "<u4",
    "U64": "<u8",
    "BOOL": "?",
}
MAX_HEADER = 100 << 20  # the limit safetensors itself sets
DTYPE = {  # torch dtype (as str() names it) -> safetensors dtype
    "torch.float64": "F64",
    "torch.float32": "F32",
    "torch.float16": "F16",
    "torch.bfloat16": "BF16",
    "torch.float8_e4m3fn": "F8_E4M3",
    "torch.float8_e5m2": "F8_E5M2",
    "torch.int64": "I64",
    "torch.int32": "I32",
    "torch.int16": "I16",
    "torch.int8": "I8",
    "torch.uint8": "U8",
    "torch.uint16": "U16",
    "torch.uint32": "U32",
    "torch.uint64": "U64",
    "torch.bool": "BOOL",
}


class NotSafetensors(ValueError):
    """The file is not a (whole) safetensors file; the message says why."""


def _float8(exponent_bits: int, bias: int, finite_only: bool) -> np.ndarray:
    """float32 value of each of the 256 bytes of a float8 format (OCP E4M3FN, E5M2)."""
    mantissa_bits = 7 - exponent_bits
    out = np.empty(256, dtype=np.float32)
    for byte in range(256):
        sign = -1.0 if byte & 0x80 else 1.0
        exponent = (byte >> mantissa_bits) & ((1 << exponent_bits) - 1)
        mantissa = byte & ((1 << mantissa_bits) - 1)
        top = exponent == (1 << exponent_bits) - 1
        if finite_only and top and mantissa == (1 << mantissa_bits) - 1:
            value = math.nan  # E4M3FN: only S.1111.111 is NaN, no infinities
        elif not finite_only and top:
            value = math.inf if mantissa == 0 else math.nan
        elif exponent == 0:
            value = mantissa / (1 << mantissa_bits) * 2.0 ** (1 - bias)
        else:
            value = (1 + mantissa / (1 << mantissa_bits)) * 2.0 ** (exponent - bias)
        out[byte] = sign * value
    return out


FLOAT8 = {"F8_E4M3": _float8(4, 7, True), "F8_E5M2": _float8(5, 15, False)}


def _as_numbers(raw: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "BF16":
        return (raw.astype(np.uint32) << 16).view(np.float32)
    if dtype in FLOAT8:
        return FLOAT8[dtype][raw]
    return raw


class Slice:
    """One tensor: dtype and shape from the header, rows read on indexing (`t[a:b]`)."""

    def __init__(self, data: np.memmap, name: str, entry: dict[str, Any]) -> None:
        self.name, self._data = name, data
        self.dtype, self.shape = entry["dtype"], list(entry["shape"])
        self._begin, self._end = entry["data_offsets"]
        self._numpy = np.dtype(NUMPY[self.dtype])

    def get_dtype(self) -> str:
        return self.dtype

    def get_shape(self) -> list[int]:
        return self.shape

    def __getitem__(self, rows: slice) -> np.ndarray:
        return _as_numbers(self.raw(rows), self.dtype)

    def raw(self, rows: slice) -> np.ndarray:
        """Rows as stored, not copied (BF16 as uint16 bits, float8 as bytes): a view of the
        mapped file."""
        first, last, step = rows.indices(self.shape[0] if self.shape else 1)
        if step != 1:
            raise ValueError("rows are read as one contiguous range")
        row = math.prod(self.shape[1:]) * self._numpy.itemsize
        start = self._begin + first * row
        count = max(0, last - first) * row // self._numpy.itemsize
        raw = np.frombuffer(self._data, self._numpy, count, start)
        return raw.reshape(max(0, last - first), *self.shape[1:])

    def all(self) -> np.ndarray:
        if not self.shape:  # a scalar
            raw = np.frombuffer(self._data, self._numpy, 1, self._begin).reshape(())
            return _as_numbers(raw, self.dtype)
        return self[:]


class SafetensorsFile:
    """`safe_open`'s reading interface (metadata, keys, get_slice, get_tensor) over numpy."""

    def __init__(self, path: str) -> None:
        size = os.path.getsize(path)
        with open(path, "rb") as handle:
            head = handle.read(8)
            if len(head) < 8:
                raise NotSafetensors(f"not a safetensors file: {size} bytes, shorter than a header")
            (length,) = struct.unpack("<Q", head)
            if length > min(MAX_HEADER, size - 8):
                raise NotSafetensors(
                    f"not a safetensors file: its first 8 bytes give a {length:,}-byte header, "
                    f"the file has {size:,} bytes"
                )
            try:
                header = json.loads(handle.read(length))
            except ValueError as exc:
                raise NotSafetensors(
                    f"not a safetensors file: the header is not JSON ({exc})"
                ) from None
        if not isinstance(header, dict):
            raise NotSafetensors("not a safetensors file: the header is not a JSON object")
        self._metadata = header.pop("__metadata__", None) or {}
        data_bytes = size - 8 - length
        self._data = (
            np.memmap(path, np.uint8, "r", offset=8 + length)
            if data_bytes
            else np.zeros(0, np.uint8)
        )
        self._tensors: dict[str, Slice] = {}
        for name, entry in header.items():
            self._tensors[name] = self._entry(name, entry, data_bytes)

    def _entry(self, name: str, entry: Any, data_bytes: int) -> Slice:
        try:
            dtype, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
            itemsize = np.dtype(NUMPY[dtype]).itemsize
        except (KeyError, TypeError, ValueError) as exc:
            raise NotSafetensors(f"tensor {name!r} has a malformed header entry: {exc}") from exc
        if end - begin != math.prod(shape) * itemsize:
            raise NotSafetensors(
                f"tensor {name!r}: {end - begin} bytes for {dtype} {shape} in the header"
            )
        if not 0 <= begin <= end <= data_bytes:
            raise NotSafetensors(
                f"cut short: tensor {name!r} ends at byte {end:,} of the data, which has "
                f"{data_bytes:,}"
            )
        return Slice(self._data, name, entry)

    def __enter__(self) -> SafetensorsFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self._tensors.clear()

    def metadata(self) -> dict[str, str]:
        return dict(self._metadata)

    def keys(self) -> list[str]:
        return list(self._tensors)

    def get_slice(self, name: str) -> Slice:
        return self._tensors[name]

    def get_tensor(self, name: str) -> np.ndarray:
        return self._tensors[name].all()


def _raw(tensor: Any) -> tuple[memoryview, Any]:
    """The bytes of a torch tensor, flat, and the tensor that owns them (keep it while the
    bytes are read). A contiguous CPU tensor's own memory is read through ctypes, with no torch
    op (each op hands the GIL back and waits to get it again, up to 5 ms while vLLM's engine
    thread runs); anything else is copied first."""
    if tensor.device.type != "cpu" or not tensor.is_contiguous():
        tensor = tensor.detach().cpu().contiguous()
    size = tensor.numel() * tensor.element_size()
    if size == 0:
        return memoryview(b""), tensor
    return memoryview((ctypes.c_ubyte * size).from_address(tensor.data_ptr())).cast("B"), tensor


def write(path: str, tensors: dict[str, Any], metadata: dict[str, str] | None = None) -> None:
    """Write torch CPU tensors to `path` as safetensors (what `safe_open` and `load_file` read).

    The header is built here; the header and each tensor's bytes (its own memory, no copy) go
    to the file in one `writev(2)`, which releases the GIL: a writer thread asks for the GIL
    back a handful of times a file, not once per torch call and write. A dtype outside DTYPE
    raises ValueError.
    """
    header: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    views, keep, offset = [], [], 0
    for name, tensor in tensors.items():
        if str(tensor.dtype) not in DTYPE:
            raise ValueError(f"tensor {name!r}: no safetensors dtype for {tensor.dtype}")
        raw, owner = _raw(tensor)
        header[name] = {
            "dtype": DTYPE[str(tensor.dtype)],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + raw.nbytes],
        }
        views.append(raw)
        keep.append(owner)  # the memory `raw` reads stays alive until written
        offset += raw.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as safetensors' own
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _write_all(fd, [memoryview(struct.pack("<Q", len(text)) + text), *views])
    finally:
        os.close(fd)


def _write_all(fd: int, buffers: list[memoryview]) -> None:
    """`os.writev` until every byte is written (the kernel may take part of a large call)."""
    buffers = [b for b in buffers if b.nbytes]
    while buffers:
        done = os.writev(fd, buffers)
        while buffers and done >= buffers[0].nbytes:
            done -= buffers.pop(0).nbytes
        if buffers and done:
            buffers[0] = buffers[0][done:]
