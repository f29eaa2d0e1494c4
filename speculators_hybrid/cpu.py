"""Running vLLM's planning code on a CPU-only machine (doctor, tests).

vLLM picks no platform without a GPU: force its CPU platform before vLLM is used. PyPI's
torchvision is a CUDA build that cannot load beside a CPU torch, yet vLLM's Qwen3.5 module
imports transformers' image processors, which import torchvision; nothing on this path runs
vision code, so where torchvision cannot be imported an inert stand-in module is used.
The platform answers as any host would (`planning_platform`): a plan must not depend on the CPU
it was made on. Never call this inside a serving vLLM process.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from collections.abc import Iterator
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


@contextlib.contextmanager
def no_cpu_features() -> Iterator[None]:
    """Every `torch.cpu._is_<feature>_supported()` answers False inside; the host's come back after.

    vLLM's CPU platform asks them while it builds a config: on an AMX host 0.22-0.24 turn prefix
    caching and chunked prefill off for models with linear attention and 0.26-0.28 make the SSM
    state float32; on an AVX-512 BF16 host 0.29+ make it float32 (its page size) and set
    `VLLM_SSM_CONV_STATE_LAYOUT=SD` (the conv state's shape) for the process, as 0.22-0.28 do
    with AMX. A CUDA start does none of that.
    """
    import torch

    probes = {n: getattr(torch.cpu, n) for n in dir(torch.cpu) if is_feature_probe(n)}
    for name in probes:
        setattr(torch.cpu, name, lambda: False)
    try:
        yield
    finally:
        for name, probe in probes.items():
            setattr(torch.cpu, name, probe)


def is_feature_probe(name: str) -> bool:
    return name.startswith("_is_") and name.endswith("_supported")


@contextlib.contextmanager
def with_triton() -> Iterator[None]:
    """vLLM reads Triton as present inside, as on a CUDA start; as it was after.

    vLLM 0.34's CPU platform refuses an x86 host without triton-cpu while it builds a config
    (0.33 warned); a plan is the one a CUDA start makes, which has Triton.
    """
    import vllm.triton_utils as triton_utils

    found = triton_utils.HAS_TRITON
    triton_utils.HAS_TRITON = True
    try:
        yield
    finally:
        triton_utils.HAS_TRITON = found


@functools.cache
def planning_platform() -> Any:
    """vLLM's CPU platform with the host's facts fixed, so a plan is the same on every host.
    One instance per process: vLLM modules that bound `current_platform` keep seeing it.

    The one place where planning on the CPU is made host-independent. Overrides, each a
    question vLLM asks of the host:
    - the CPU's features (AMX, AVX-512 BF16, ...): none while vLLM builds a config or picks an
      attention backend (`no_cpu_features`);
    - the CPU architecture: x86 (an ARM host adds custom ops, a RISC-V host turns prefix
      caching and chunked prefill off in `EngineArgs`);
    - Triton: present while vLLM builds a config (`with_triton`).
    What the CPU platform changes on every host (block size 128, executor, async scheduling,
    CUDA graphs) is not host-dependent; `planning.layer_specs` sets the block sizes a CUDA
    start uses before it plans.
    """
    from vllm.platforms.cpu import CpuPlatform
    from vllm.platforms.interface import CpuArchEnum

    class PlanningPlatform(CpuPlatform):
        @classmethod
        def get_cpu_architecture(cls) -> CpuArchEnum:
            return CpuArchEnum.X86

        @classmethod
        def check_and_update_config(cls, vllm_config: Any) -> None:
            with no_cpu_features(), with_triton():
                super().check_and_update_config(vllm_config)

        @classmethod
        def get_attn_backend_cls(cls, *args: Any, **kwargs: Any) -> Any:
            with no_cpu_features():
                return super().get_attn_backend_cls(*args, **kwargs)

    return PlanningPlatform()


def force_cpu_platform() -> None:
    import vllm.platforms as platforms

    platforms._current_platform = planning_platform()


def prepare() -> None:
    stand_in_torchvision()
    force_cpu_platform()
