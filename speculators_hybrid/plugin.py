"""vLLM general plugin: arms our patches in every vLLM process.

vLLM calls `register()` once per process (API server, engine core, each worker) through the
`vllm.general_plugins` entry point; `VLLM_PLUGINS` (vLLM's allow-list) applies as usual.
`SPECULATORS_HYBRID_DISABLE=1` turns it off. Where a patch's target is not the code it was
written for, nothing is patched and only hidden-state extraction from a hybrid model is refused
(speculators_hybrid/guard.py says the rule).

Every vLLM process pays for importing this module, so it imports little: the patch framework
(wrapt, `registry`, `model_registration`, the patch modules) is imported by `register()` once
it knows patches may apply (not disabled, vLLM installed), or by the first use of `PATCHER` or
`Patcher` from here (both live in `registry`). `benchmarks/import_cost.py` measures what is left.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING, Any

from speculators_hybrid import switches
from speculators_hybrid.switches import disabled
from speculators_hybrid.versions import installed

if TYPE_CHECKING:
    from speculators_hybrid.registry import Patch, Patcher

logger = logging.getLogger("vllm.speculators_hybrid")

PATCHER: Patcher  # registry.PATCHER, the process-wide patcher


def __getattr__(name: str) -> Any:
    if name in ("PATCHER", "Patcher"):
        from speculators_hybrid import registry

        return getattr(registry, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def patcher() -> Patcher:
    """`registry.patcher()`, the process-wide patcher (importing the patch framework)."""
    from speculators_hybrid import registry

    return registry.patcher()


_ROLES = (
    ("init_worker", "worker"),
    ("EngineCore", "engine-core"),
    ("EngineArgs", "frontend"),
)


def role() -> str:
    """Which vLLM process is loading us, from the caller's frames."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_name
        qual = getattr(frame.f_code, "co_qualname", name)
        for marker, label in _ROLES:
            if marker in qual:
                return label
        frame = frame.f_back  # type: ignore[assignment]
    return "unknown"


def vllm_patches() -> tuple[Patch, ...]:
    from speculators_hybrid.vllm_patches import PATCHES

    return PATCHES


def unknown_disabled() -> str | None:
    """The one-line error when SPECULATORS_HYBRID_DISABLED_PATCHES names an id that no patch
    (vLLM's or speculators') has; None when it names none such, or is unset."""
    off = switches.disabled_patches()
    if not off:
        return None  # the usual case: nothing more imported
    from speculators_hybrid.speculators_patches import PATCHES as TRAINING

    unknown = sorted(off - {p.id for p in (*vllm_patches(), *TRAINING)})
    if not unknown:
        return None
    return (
        f"{switches.DISABLED_PATCHES} names no patch: {', '.join(unknown)} "
        "(`speculators-hybrid patches list` with it unset shows the ids)"
    )


def register() -> None:
    if disabled():
        logger.info(
            "speculators-hybrid: disabled by SPECULATORS_HYBRID_DISABLE, pid=%d", os.getpid()
        )
        return
    version = installed("vllm")
    if version is None:
        return
    from speculators_hybrid import guard
    from speculators_hybrid.model_registration import REGISTRAR

    guard.install()  # first: the patches wrap on top of it
    problem = unknown_disabled()
    if problem:  # `launch` and `patches list` refuse it; here vLLM is already starting
        logger.error("speculators-hybrid: %s", problem)
    selected = patcher().apply(vllm_patches())
    failed = patcher().failed
    if failed is None:
        REGISTRAR.apply(selected)  # the selected `Registration`s: architectures vLLM lacks
    logger.info(
        "speculators-hybrid: pid=%d role=%s vllm=%s patches=%s",
        os.getpid(),
        role(),
        version,
        (",".join(p.id for p in selected) or "none")
        if failed is None
        else f"none ({failed.short()}; hybrid extraction will be refused)",
    )
    off = switches.disabled_patches()
    if off:
        logger.warning(
            "speculators-hybrid: off by %s: %s", switches.DISABLED_PATCHES, ",".join(sorted(off))
        )
