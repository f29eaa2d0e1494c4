"""vLLM's facts about the model classes the tests build, learnt once per session.

vLLM learns what a model class supports (its `_ModelInfo`) by importing the class's module in a
fresh Python, then keeps the answer in VLLM_CACHE_ROOT/modelinfos under the module's hash. On a
clean machine (CI) every class a test builds costs one such Python, ~10 s of importing vLLM:
~165 s of each release's ~230 s. `warm` asks vLLM the same questions for every family's class in
one fresh Python, through vLLM's own `inspect_model_cls`, so the cache holds what vLLM's own
Pythons would have written. The cache root is one per vLLM install, so that the patched copy of
tests/upstream and the release it is made from do not overwrite each other's answers.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from speculators_hybrid.families import FAMILIES

# every family's class, and the others the CPU tests build
ARCHITECTURES = (
    *(f.architecture for f in FAMILIES),
    "Qwen3ForCausalLM",
    "ExtractHiddenStatesModel",
)

# Run in the fresh Python: it stands in for the one vLLM would start for each class.
WARM = """
import sys
from vllm.model_executor.models import registry
registry._run_in_subprocess = lambda fn: fn()
for arch in sys.argv[1:]:
    model = registry.ModelRegistry.models.get(arch)
    if model is None:
        continue
    try:
        model.inspect_model_cls()
    except Exception as exc:
        print(f"not cached: {arch}: {type(exc).__name__}: {exc}")
"""


def cache_root() -> Path:
    """VLLM_CACHE_ROOT for this vLLM install (found without importing vLLM)."""
    spec = importlib.util.find_spec("vllm")
    where = str(Path(spec.origin).parent) if spec and spec.origin else sys.prefix
    key = hashlib.sha256(where.encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / "speculators-hybrid-tests" / f"vllm-{key}"


def use_own_root() -> None:
    """Before vLLM reads its settings: this install's cache root, here and in subprocesses."""
    os.environ["VLLM_CACHE_ROOT"] = str(cache_root())


def warm() -> None:
    """vLLM's model facts for ARCHITECTURES in the cache, from one fresh Python."""
    # not fatal: vLLM then learns each class the slow way, in a Python of its own
    try:
        done = subprocess.run(
            [sys.executable, "-c", WARM, *ARCHITECTURES],
            capture_output=True,
            text=True,
            timeout=600,
        )
    except subprocess.TimeoutExpired:
        print("model_info_cache: not warmed in 600 s", file=sys.stderr)
        return
    if done.returncode != 0:
        print(f"model_info_cache: {done.stderr.strip()[-2000:]}", file=sys.stderr)
    for line in done.stdout.splitlines():
        if line.startswith("not cached: "):
            print(f"model_info_cache: {line}", file=sys.stderr)


def cached() -> set[str]:
    """Names of the cache's files (module-class.json)."""
    folder = cache_root() / "modelinfos"
    return {p.name for p in folder.glob("*.json")} if folder.is_dir() else set()
