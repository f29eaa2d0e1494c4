"""Whether transformers or vLLM can read a target's `model_type`: `doctor` and `launch` refuse
one neither knows (a typo, or a transformers too old for the family) in one line, before vLLM
fails on it with a traceback."""

from __future__ import annotations

from typing import Any

from speculators_hybrid.launcher.target import HYBRID_MODEL_TYPES


def refuse_unknown(config: dict[str, Any]) -> str | None:
    """`unknown_model_type` for what `launch` is about to start; the families this project
    knows are left to vLLM (no transformers import on their way to the server)."""
    if config.get("model_type") in HYBRID_MODEL_TYPES:
        return None
    return unknown_model_type(config)


def unknown_model_type(config: dict[str, Any]) -> str | None:
    """Why neither transformers nor vLLM's own config classes read this config's model_type
    (None: one of them does); vLLM would fail on it. Imports transformers (seconds), and
    vLLM's config module where transformers lacks it."""
    model_type = config.get("model_type")
    try:
        from transformers import CONFIG_MAPPING
        from transformers import __version__ as transformers_version
    except ImportError:  # no transformers here (vLLM's own venv has it): nothing to say
        return None

    from speculators_hybrid.versions import installed

    if model_type in CONFIG_MAPPING:
        return None
    try:
        from vllm.transformers_utils.config import _CONFIG_REGISTRY as vllm_configs
    except ImportError:  # another vLLM layout: let vLLM's own error speak
        return None
    if model_type in vllm_configs:
        return None
    if not isinstance(model_type, str):
        return "config.json has no model_type: transformers and vLLM read a config by it"
    return (
        f"model_type {model_type!r} is known to neither transformers {transformers_version} nor "
        f"vLLM {installed('vllm')}: check config.json's model_type, or install a transformers "
        "release that has it"
    )
