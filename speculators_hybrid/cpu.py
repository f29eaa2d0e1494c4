"""Running vLLM's planning code on a CPU-only machine (doctor, tests).

vLLM picks no platform without a GPU: force its CPU platform before vLLM is used. PyPI's
torchvision is a CUDA build that cannot load beside a CPU torch, yet vLLM's Qwen3.5 module
imports transformers' image processors, which import torchvision; nothing on this path runs
vision code, so where torchvision cannot be imported an inert stand-in module is used.
Never call this inside a serving vLLM process.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from typing import Any


class _Inert:
    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> _Inert:
        return inert_attribute(self._name, attr)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self._name}: torchvision is not installed (CPU planning only)")


def inert_attribute(module: str, attr: str) -> _Inert:
    if attr.startswith("__"):
        raise AttributeError(attr)
    return _Inert(f"{module}.{attr}")


class _InertFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves every submodule of `torchvision` as an inert package."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if not fullname.startswith("torchvision."):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: Any) -> types.ModuleType:
        module = types.ModuleType(spec.name)
        module.__getattr__ = functools.partial(inert_attribute, spec.name)  # type: ignore[method-assign]
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def install_inert_finder() -> None:
    if not any(isinstance(f, _InertFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _InertFinder())


def _torchvision_loads() -> bool:
    if importlib.util.find_spec("torchvision") is None:
        return False
    try:
        import torchvision  # noqa: F401
    except Exception:
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        return False
    return True


STANDINS = os.path.join(os.path.dirname(__file__), "cpu_standins")


def stand_in_torchvision() -> None:
    """Put the inert torchvision first on the path, here and in subprocesses."""
    if "torchvision" in sys.modules or _torchvision_loads():
        return
    sys.path.insert(0, STANDINS)
    path = os.environ.get("PYTHONPATH", "")
    if STANDINS not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (STANDINS, path) if p)


def force_cpu_platform() -> None:
    import vllm.platforms as platforms
    from vllm.platforms.cpu import CpuPlatform

    platforms._current_platform = CpuPlatform()


def prepare() -> None:
    stand_in_torchvision()
    force_cpu_platform()
