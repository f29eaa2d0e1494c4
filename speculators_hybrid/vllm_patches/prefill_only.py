"""Prefill-only extraction: no spare state block per request (`launch`'s default for hybrids).

Why: extraction runs vLLM's speculative decoding with one draft token, so every Mamba / Gated
DeltaNet layer reserves one more state block per request (`num_speculative_blocks` = 1) to
verify that token while decoding. speculators' data generation sends `max_tokens=1`: a request
ends with its prefill and never decodes, so that block is never used, yet vLLM bills it (for
Qwen3.6-27B about an eighth of the KV tokens: tests/cpu/test_qwen36_planning.py pins the plan).
How: with `SPECULATORS_HYBRID_PREFILL_ONLY=1` (`launch` sets it for hybrid targets), while
extracting, the state layers report no speculative block, and the engine refuses, before the
request reaches the scheduler, any request that would decode (`max_tokens` other than 1):
without its spare block a decoding request's draft state would land in a block it does not own.
`launch --allow-decode`, or vLLM started without `launch` (the variable unset), serves clients
that generate (vLLM's `include_output_tokens`, `max_tokens` > 1) as before.
Upstream: none; a mode of this project. Remove when vLLM sizes the spare blocks by need.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from speculators_hybrid import switches
from speculators_hybrid.registry import Patch, Target
from speculators_hybrid.vllm_patches._targets import is_extraction

ENV = switches.PREFILL_ONLY
MAMBA = "vllm.model_executor.layers.mamba.abstract"
INPUTS = "vllm.v1.engine.input_processor"


def enabled() -> bool:
    return switches.on(ENV)


def speculative_blocks(vllm_config: Any) -> int:
    """The spare state blocks a state layer reserves per request under this mode."""
    spec = getattr(vllm_config, "speculative_config", None)
    if spec is None or (enabled() and is_extraction(vllm_config)):
        return 0
    return int(spec.num_speculative_tokens or 0)


def refusal(max_tokens: Any) -> str | None:
    if max_tokens == 1:
        return None
    return (
        f"speculators-hybrid: this server extracts prompts only ({ENV}=1): a request must "
        f"have max_tokens=1, got {max_tokens}; restart with `launch --allow-decode` to generate"
    )


def _spec(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    spec = wrapped(*args, **kwargs)
    vllm_config = args[0] if args else kwargs.get("vllm_config")
    spare = int(getattr(spec, "num_speculative_blocks", None) or 0)
    if spare and enabled() and is_extraction(vllm_config):
        spec = replace(spec, num_speculative_blocks=0)
    return spec  # else as vLLM made it (0.33's ReplaySSM also drops the spare blocks)


def _validate(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    from vllm import SamplingParams

    params = args[0] if args else kwargs.get("params")
    if enabled() and is_extraction(instance.vllm_config) and isinstance(params, SamplingParams):
        why = refusal(params.max_tokens)
        if why:
            raise ValueError(why)
    return wrapped(*args, **kwargs)


PATCH = Patch(
    id="prefill-only-extraction",
    project="vllm",
    versions=">=0.20",
    fixed_upstream="none (a mode of this project)",
    why=__doc__ or "",
    targets=(
        Target(
            MAMBA,
            "MambaBase.get_kv_cache_spec",
            _spec,
            # 0.20-, 0.29-, 0.32-, 0.34.0 (the spec also takes the state's alignment)
            ("5c8613539c1ff400", "2079da7048c500fa", "c814625e3b63bbd5", "bfcc7ce0ec248918"),
        ),
        Target(
            INPUTS,
            "InputProcessor._validate_params",
            _validate,
            (
                "e7a4ebc7370c876f",  # 0.20.0-0.22.1
                "db0846e06a7cb63c",  # 0.23.0-0.26.0
                "98190e71b2850801",  # 0.27.x
                "a60c574d1a006626",  # 0.28.0
                "703512ece553e3c1",  # 0.29.0-0.30.0
                "05eb187c91954320",  # 0.31.0
                "c91ea5c91a9840bc",  # 0.32.0-0.33.0
                "ce0f045cd220b2c9",  # 0.34.0 (one V2-runner check gone)
            ),
        ),
    ),
)
