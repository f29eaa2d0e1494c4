"""Fail closed for extraction, open for everything else.

The rule: in a vLLM process the plugin's patches are armed as their modules are imported and
verified as a whole (registry.Patcher, non-strict). If a target is missing or is not the code a
patch was written for (an untested release, a fork, a future vLLM), nothing is patched, one
error line is logged, and vLLM runs as if the plugin were absent: serving any model, or
extracting from a non-hybrid one, is unaffected. Extraction from a hybrid model is what the
patches exist for, so when vLLM builds a config for it, every target module is imported and
verified first, and if the set does not hold the config is refused with one line saying which
target changed, that nothing was patched, and what to do.

The check wraps `VllmConfig.__post_init__` (it only looks; it replaces nothing, so it needs no
fingerprint) and is installed by `plugin.register()` in every vLLM process.
"""

from __future__ import annotations

import logging
from typing import Any

import wrapt

from speculators_hybrid import support

logger = logging.getLogger("vllm.speculators_hybrid")

MODULE, ATTR = "vllm.config.vllm", "VllmConfig.__post_init__"


class ExtractionRefused(RuntimeError):
    """Hybrid extraction asked for on a vLLM whose code the patches do not fit.

    Not a ValueError: vLLM's pydantic configs would wrap that in a validation report."""


def message(error: Any, version: str | None) -> str:
    return (
        f"speculators-hybrid: hidden-state extraction from a hybrid model refused on vLLM "
        f"{version}: {error.short()}, so nothing was patched. Install a tested vLLM release "
        f"({support.tested_range()}), or set SPECULATORS_HYBRID_DISABLE=1 if this vLLM fixes "
        "hybrid extraction itself."
    )


def _check(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    from speculators_hybrid.registry import patcher
    from speculators_hybrid.vllm_patches._targets import is_hybrid_extraction

    if is_hybrid_extraction(instance):
        patches = patcher()
        failed = patches.verify_all() if patches.active or patches.failed else None
        if failed is not None:
            raise ExtractionRefused(message(failed, patches.version_of("vllm")))
    return wrapped(*args, **kwargs)


def installed(owner: Any) -> bool:
    layer = vars(owner).get("__post_init__")
    while isinstance(layer, wrapt.ObjectProxy):
        if getattr(layer, "_self_wrapper", None) is _check:
            return True
        layer = layer.__wrapped__
    return False


def _install(module: Any) -> None:
    owner = getattr(module, ATTR.split(".")[0], None)
    if owner is not None and not installed(owner):
        wrapt.wrap_function_wrapper(module, ATTR, _check)


def install() -> None:
    """Idempotent; fires when vllm.config.vllm is imported (at once if it is). Install it
    before the patches: they wrap on top of it, so reverting them keeps it."""
    wrapt.register_post_import_hook(_install, MODULE)
