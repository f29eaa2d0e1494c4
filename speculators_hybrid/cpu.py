"""Running vLLM's planning code on a CPU-only machine (doctor, align_mode, tests).

vLLM picks no platform without a GPU: force its CPU platform before vLLM is used. PyPI's
torchvision is a CUDA build that cannot load beside a CPU torch, yet vLLM's Qwen3.5 module
imports transformers' image processors, which import torchvision; nothing on this path runs
vision code, so where torchvision cannot be imported an inert stand-in module is used.
The platform answers as any host would (`planning_platform`): a plan must not depend on the CPU
it was made on. Never call this inside a serving vLLM process. `quiet_vllm` and `vllm_error`
keep vLLM's logs off a command's report and its errors to one line.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
import os
import sys
from collections.abc import Iterator
from typing import Any


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


def quiet_vllm(verbose: bool) -> None:
    """vLLM's logs go to stderr (stdout is the report); without `verbose`, only what stops it."""
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    if not verbose:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "CRITICAL")
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        # vLLM 0.33 on a CPU torch: "Triton not available, find_triton_kernels = []" (torch
        # resets its own top logger when imported; this one it leaves as set)
        logging.getLogger("torch._library.triton").setLevel(logging.ERROR)
        # vLLM 0.33 leaves its loggers unconfigured on import: their warnings (a CPU machine's
        # missing triton, with tracebacks) would reach Python's last-resort handler
        level = logging.getLevelName(os.environ["VLLM_LOGGING_LEVEL"].upper())
        logging.getLogger("vllm").setLevel(level if isinstance(level, int) else logging.CRITICAL)


def vllm_error(exc: BaseException) -> str:
    """vLLM's error in one line: a config's pydantic ValidationError as its messages alone
    (no `input_value=ArgsKwargs(...)` echo, no errors.pydantic.dev link)."""
    errors = getattr(exc, "errors", None)
    if type(exc).__name__ == "ValidationError" and callable(errors):
        try:
            messages = [str(e.get("msg", "")) for e in errors()]
        except Exception:  # noqa: BLE001 (not pydantic's after all)
            messages = []
        if messages:
            return " ".join(m.removeprefix("Value error, ") for m in messages)
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"
