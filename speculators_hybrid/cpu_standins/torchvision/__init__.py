"""Inert stand-in for torchvision, put on the path only by `speculators_hybrid.cpu.prepare()`.

Lives on disk so that subprocesses vLLM starts (model inspection) see it too, and imports
nothing of speculators_hybrid: every name and submodule is inert, and calling one raises.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

__version__ = "0.0"


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


install_inert_finder()


def __getattr__(attr: str) -> _Inert:
    return inert_attribute("torchvision", attr)
