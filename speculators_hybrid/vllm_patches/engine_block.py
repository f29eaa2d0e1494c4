"""The hidden-state group's block size divides the engine's, and the engine keeps its own.

Why: after planning, vLLM's engine core sets `cache_config.block_size` to the smallest block
size of all KV-cache groups. A hidden-state group holds fewer tokens per page than attention,
so its block size wins: the prefix-cache hash block no longer divides every group's block and
`HybridKVCacheCoordinator` asserts at start-up ("block_size must be divisible by
hash_block_size", vLLM 0.25.0 with prefix caching); where it does start, Mamba prefill chunks
are aligned to the hidden group's block instead of the model's.
How: the hidden group's block size is the largest divisor of the engine block size that fits
its page; the engine block size recorded at planning (the smallest of the model's own groups)
is put back just before vLLM validates it.
Upstream: no fix yet.
"""

from __future__ import annotations

import weakref
from typing import Any

from speculators_hybrid.registry import Patch, Target, argument
from speculators_hybrid.vllm_patches._targets import (
    CONFIG,
    GROUPS,
    PLANNING,
    PLANNING_GROUPS,
    UTILS,
    VALIDATE_BLOCK_SIZE,
)

# id(CacheConfig) -> the engine block size without the hidden-state group, per process; an
# entry goes with its CacheConfig (a later config may get the same id).
ENGINE_BLOCK: dict[int, int] = {}


def remember_engine_block(vllm_config: Any, model_groups: list[Any]) -> None:
    cache = vllm_config.cache_config
    key = id(cache)
    if key not in ENGINE_BLOCK:
        weakref.finalize(cache, ENGINE_BLOCK.pop, key, None)
    ENGINE_BLOCK[key] = min(g.kv_cache_spec.block_size for g in model_groups)


def restore_engine_block(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """Before `VllmConfig.validate_block_size`: undo the engine core's min() over our group."""
    cache = instance.cache_config
    block = ENGINE_BLOCK.get(id(cache))
    if block is not None and cache.block_size != block:
        cache.block_size = block
    return wrapped(*args, **kwargs)


def _refit_hidden_group(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    from vllm.v1.kv_cache_interface import HiddenStateCacheSpec, KVCacheGroupSpec

    from speculators_hybrid.vllm_patches.spec import fit_to_page

    groups = wrapped(*args, **kwargs)
    vllm_config = argument(args, kwargs, 0, "vllm_config")
    hidden = [i for i, g in enumerate(groups) if isinstance(g.kv_cache_spec, HiddenStateCacheSpec)]
    model = [g for i, g in enumerate(groups) if i not in hidden]
    if not hidden or not model:
        return groups
    remember_engine_block(vllm_config, model)
    block = vllm_config.cache_config.block_size
    for i in hidden:
        spec = groups[i].kv_cache_spec
        if block % spec.block_size:
            groups[i] = KVCacheGroupSpec(
                groups[i].layer_names, fit_to_page(spec, spec.page_size_bytes, block)
            )
    return groups


PATCH = Patch(
    id="hidden-block-divides-engine-block",
    project="vllm",
    versions=">=0.22",
    fixed_upstream="none yet",
    why=__doc__ or "",
    targets=(
        Target(
            UTILS,
            "get_kv_cache_groups",
            _refit_hidden_group,
            GROUPS,
            versions="<0.33",
        ),
        Target(
            PLANNING,
            "get_kv_cache_groups",
            _refit_hidden_group,
            PLANNING_GROUPS,
            versions=">=0.33",
        ),
        Target(
            CONFIG,
            "VllmConfig.validate_block_size",
            restore_engine_block,
            VALIDATE_BLOCK_SIZE,
        ),
    ),
)
