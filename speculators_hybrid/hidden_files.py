"""The hidden-state files both sides share: the writer (our connector) and the readers (`check`,
`verify`).

Files are safetensors; speculators' readers find sample i's as `hs_<i>.safetensors`. Where the
writer refused or failed to write a file, `<path>.rejected` holds the reason instead. Provenance
metadata lists the speculators-hybrid patch ids the writer ran with under `PATCHES_KEY`.
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
