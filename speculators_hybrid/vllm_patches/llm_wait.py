"""`LLM.generate` returns when the hidden-state files it names are whole (vLLM < 0.22).

Why: our connector writes files off the engine step (writer.py), so when `vllm.LLM` hands
back the last outputs their files may still be in a writer thread; code that reads
`kv_transfer_params["hidden_states_path"]` right away (as vLLM's offline example does) would
find no file yet. A reader that waits on `<path>.lock` is safe; this makes the plain one safe.
How: after `LLM._run_engine` (every offline entry point ends there) wait, for each finished
output naming a hidden-state file, until `<path>.lock` is free, the writer's exclusive lock
having been taken before the output left the engine. The lock file stays for other readers.
Upstream: none (vLLM >= 0.22's connector writes off the step too, but on its next engine
step, so an offline caller that waited could wait forever: not served here).
"""

from __future__ import annotations

import fcntl
import os
from typing import Any

from speculators_hybrid.registry import Patch, Target

PATH_KEY = "hidden_states_path"


def wait_for_file(path: str) -> None:
    """Block until no writer holds `<path>.lock` (at once when there is no lock file)."""
    try:
        lock = os.open(f"{path}.lock", os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        fcntl.flock(lock, fcntl.LOCK_SH)
    finally:
        os.close(lock)


def files_of(outputs: Any) -> list[str]:
    paths = []
    for output in outputs or ():
        params = getattr(output, "kv_transfer_params", None)
        if isinstance(params, dict) and isinstance(params.get(PATH_KEY), str):
            paths.append(params[PATH_KEY])
    return paths


def _wait_after_run(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    outputs = wrapped(*args, **kwargs)
    for path in files_of(outputs):
        wait_for_file(path)
    return outputs


PATCH = Patch(
    id="files-whole-when-generate-returns",
    project="vllm",
    versions=">=0.20,<0.22",
    fixed_upstream="none (our connector's off-step writes; vLLM < 0.22 writes in the step)",
    why=__doc__ or "",
    targets=(
        # 0.20.0, 0.20.1, 0.20.2, 0.21.0: the same code
        Target("vllm.entrypoints.llm", "LLM._run_engine", _wait_after_run, ("16059b12ca893147",)),
    ),
)
