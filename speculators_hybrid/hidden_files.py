"""The hidden-state files both sides share: the writer (our connector) and the readers (`check`,
`verify`).

Files are safetensors; speculators' readers find sample i's as `hs_<i>.safetensors`. Where the
writer refused or failed to write a file, `<path>.rejected` holds the reason instead. Provenance
metadata lists the speculators-hybrid patch ids the writer ran with under `PATCHES_KEY`.

Two backends write these files (hs-connectors, selected with `--hidden-states-backend`):
`file` stores `hidden_states` in the model's dtype; `fp8` stores them as float8 e4m3 with
`hidden_states_scales`, one float32 scale per token over every layer slot ([tokens, 1, 1]),
which the trainer's reader applies as `values.to(bf16) * scales.to(bf16)`. A file says which by
the tensors it holds, and by `BACKEND_KEY` in its metadata where the writer records it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
from collections.abc import Iterator
from typing import Any

HS_NAME = re.compile(r"^hs_(\d+)\.safetensors$")
SUFFIX = ".safetensors"
REJECTED = ".rejected"  # `<path>.rejected`: why there is no file
PATCHES_KEY = "speculators_hybrid_patches"  # in a file's metadata: the writer's patch ids
BACKEND_KEY = "hidden_states_backend"  # in a file's metadata: "file" or "fp8"
SCALES = "hidden_states_scales"  # the fp8 backend's per-token scales
FLOAT8 = ("F8_E4M3", "F8_E5M2")  # safetensors' names
SCALE_DTYPES = ("F32", "F64", "BF16", "F16")


def patch_ids(raw: str) -> set[str]:
    """Patch ids from metadata: a JSON list or a comma / space separated string."""
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    if isinstance(value, list):
        return {str(v) for v in value}
    return {p for p in re.split(r"[\s,]+", str(value)) if p}


def leave_marker(path: str, reason: str) -> bool:
    """`<path>.rejected` saying `reason`, whole or not at all: the scheduler may read it while
    a writer thread makes it. False where the folder takes no file (full, read-only, gone)."""
    marker = f"{path}{REJECTED}"
    part = f"{marker}.{os.getpid()}.{threading.get_ident()}"
    try:
        with open(part, "w") as out:
            out.write(reason)
        os.replace(part, marker)
        return True
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(part)
        return False


def natural(name: str) -> list[Any]:
    """Sort key: `hs_2` before `hs_10`."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def find_files(paths: list[str], rejected: bool = False) -> Iterator[str]:
    """The given files, and the `*.safetensors` under the given folders, in natural order; with
    `rejected`, `*.safetensors.rejected` markers too, and a missing file with one is its marker."""
    names = (SUFFIX, SUFFIX + REJECTED) if rejected else (SUFFIX,)
    for path in paths:
        if not os.path.isdir(path):
            marked = rejected and not os.path.exists(path) and os.path.exists(path + REJECTED)
            yield path + REJECTED if marked else path
            continue
        for root, dirs, files in os.walk(path):
            dirs.sort(key=natural)
            for name in sorted(files, key=natural):
                if name.endswith(names):
                    yield os.path.join(root, name)


def backend(keys: set[str], hidden_dtype: str | None) -> str:
    """Which backend's format a file is in, by its tensors: `fp8` or `file`."""
    return "fp8" if SCALES in keys or hidden_dtype in FLOAT8 else "file"


def format_problems(
    keys: set[str],
    hidden: tuple[str, list[int]],
    scales: tuple[str, list[int]] | None,
    declared: str | None,
) -> list[str]:
    """What makes a file neither backend's format: `hidden` and `scales` are (safetensors
    dtype, shape) of `hidden_states` and of `hidden_states_scales` (None: absent); `declared`
    the backend its metadata names."""
    dtype, shape = hidden
    found = backend(keys, dtype)
    problems = []
    if declared and declared != found:
        problems.append(
            f"its metadata says the {declared} backend wrote it, but its tensors are the "
            f"{found} backend's"
        )
    if dtype in FLOAT8 and scales is None:
        problems.append(
            f"{dtype} hidden_states without {SCALES}: the values cannot be scaled back (the "
            "fp8 backend writes both); write the file again"
        )
    if scales is None:
        return problems
    if dtype not in FLOAT8:
        problems.append(f"{SCALES} beside {dtype} hidden_states: the fp8 backend stores F8_E4M3")
    scale_dtype, scale_shape = scales
    if scale_dtype not in SCALE_DTYPES:
        problems.append(f"{SCALES} is {scale_dtype}, expected F32")
    want = [shape[0], *[1] * (len(shape) - 1)] if shape else None
    if scale_shape != want:
        problems.append(f"{SCALES} has shape {scale_shape}, expected {want} (one scale per token)")
    return problems
