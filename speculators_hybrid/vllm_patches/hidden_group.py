"""The extraction layer's cache in a KV-cache group of its own (vLLM < 0.22).

Why: the extraction layer (`CacheOnlyAttentionLayer`) reports a plain `MLAAttentionSpec`
built with the pre-hybrid block size (16). vLLM's planner then tries to give every layer one
page size by growing block sizes, which fails beside padded Gated DeltaNet / Mamba state pages
that are no multiple of its page ("The page size of the layer is not divisible by the maximum
page size"; Qwen3.6-27B's bf16-state look-alike); where it succeeds (the real Qwen3.6-27B, its
float32 state page 5 hidden pages), the one-layer spec type shrinks every group to one layer.
How: the layer reports a `HiddenStatesCacheSpec` (same bytes, marked); the planner groups
the model's own layers exactly as without extraction, then adds one group for the hidden
states (its one layer, or the W of `hidden-states-wide-group`) whose block size divides the
engine's block size and whose page is padded to the shared page. The KV cache manager treats
that group as full attention. The engine core then
sets its block size to the smallest group block size, which would now be the hidden group's
and break prefix caching at start-up ("block_size must be divisible by hash_block_size") and
the alignment of Mamba prefill chunks; the engine block size is put back to the smallest of
the model's own groups before vLLM validates it.
Upstream: PR 39949 (vLLM 0.22.0, `HiddenStateCacheSpec`); the engine block size is not fixed
upstream (it crashes vLLM 0.25.0 with prefix caching on).
"""

from __future__ import annotations

from typing import Any

from speculators_hybrid.registry import Patch, Target, argument
from speculators_hybrid.vllm_patches._targets import (
    CONFIG,
    GROUPS_BEFORE_022,
    VALIDATE_BLOCK_SIZE_BEFORE_022,
)
from speculators_hybrid.vllm_patches._targets import UTILS as PLANNER
from speculators_hybrid.vllm_patches.engine_block import remember_engine_block, restore_engine_block

MODELS = "vllm.model_executor.models.extract_hidden_states"
MANAGERS = "vllm.v1.core.single_type_kv_cache_manager"


def _marked_spec(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    from speculators_hybrid.vllm_patches.spec import mark

    return mark(wrapped(*args, **kwargs))


def _hma_off_because() -> str:
    """What turned the hybrid KV cache manager off, as far as we can tell, and what to do."""
    from speculators_hybrid import switches

    keep = "keep-hma-for-extraction"  # vllm_patches/hma_config.py, which keeps it on (< 0.22)
    if keep in switches.disabled_patches():
        return (
            f"{switches.DISABLED_PATCHES} turns {keep} off, and without it vLLM turns the "
            f"manager off for the connector: take {keep} out of {switches.DISABLED_PATCHES}"
        )
    return "remove --disable-hybrid-kv-cache-manager"


def _groups(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    from vllm.v1.kv_cache_interface import KVCacheGroupSpec, MambaSpec

    from speculators_hybrid.vllm_patches.spec import HiddenStatesCacheSpec, fit_to_page, plain

    vllm_config = argument(args, kwargs, 0, "vllm_config")
    specs = argument(args, kwargs, 1, "kv_cache_spec")
    hidden = {n: s for n, s in specs.items() if isinstance(s, HiddenStatesCacheSpec)}
    if not hidden:
        return wrapped(*args, **kwargs)
    rest = {n: s for n, s in specs.items() if n not in hidden}
    if not any(isinstance(s, MambaSpec) for s in rest.values()):
        # Not hybrid: vLLM's own planning, with vLLM's own spec class.
        return wrapped(vllm_config, {n: plain(s) if n in hidden else s for n, s in specs.items()})
    if vllm_config.scheduler_config.disable_hybrid_kv_cache_manager:
        raise ValueError(
            "speculators-hybrid: hidden-state extraction from a hybrid model needs vLLM's hybrid "
            f"KV cache manager; {_hma_off_because()}."
        )
    groups = wrapped(vllm_config, rest)
    pages = {g.kv_cache_spec.page_size_bytes for g in groups}
    if len(pages) != 1:
        raise ValueError(
            f"speculators-hybrid: expected the model's KV-cache groups to share one page size, "
            f"found {sorted(pages)}; this layout is not supported yet."
        )
    page = pages.pop()
    remember_engine_block(vllm_config, groups)
    block = vllm_config.cache_config.block_size
    # One group for all hidden-state layers: one today, W with hidden-states-wide-group.
    specs_of_hidden = set(hidden.values())
    if len(specs_of_hidden) != 1:
        raise ValueError(
            f"speculators-hybrid: the hidden-state layers have {len(specs_of_hidden)} different "
            "KV-cache specs; expected one."
        )
    spec = fit_to_page(specs_of_hidden.pop(), page, block)
    groups.append(KVCacheGroupSpec(list(hidden), spec))
    return groups


def _manager(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    from speculators_hybrid.vllm_patches.spec import HiddenStatesCacheSpec, plain

    if args and isinstance(args[0], HiddenStatesCacheSpec):
        args = (plain(args[0]), *args[1:])
    elif isinstance(kwargs.get("kv_cache_spec"), HiddenStatesCacheSpec):
        kwargs = {**kwargs, "kv_cache_spec": plain(kwargs["kv_cache_spec"])}
    return wrapped(*args, **kwargs)


PATCH = Patch(
    id="hidden-states-own-group",
    project="vllm",
    versions=">=0.20,<0.22",
    fixed_upstream="vLLM PR 39949, released in 0.22.0",
    why=__doc__ or "",
    # Fingerprints: the same code in 0.20.0-0.20.2 and 0.21.0.
    targets=(
        Target(
            MODELS, "CacheOnlyAttentionLayer.get_kv_cache_spec", _marked_spec, ("330c04e278e22b82",)
        ),
        Target(PLANNER, "get_kv_cache_groups", _groups, GROUPS_BEFORE_022),
        Target(MANAGERS, "get_manager_for_kv_cache_spec", _manager, ("275da2230316c5d1",)),
        Target(
            CONFIG,
            "VllmConfig.validate_block_size",
            restore_engine_block,
            VALIDATE_BLOCK_SIZE_BEFORE_022,
        ),
    ),
)
