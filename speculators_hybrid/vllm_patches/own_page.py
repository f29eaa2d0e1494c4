"""The hidden-state cache pays for its own pages only: one-layer KV-cache groups (all versions).

Why: vLLM backs every KV-cache group with one pool of blocks, and a block id is one page in
each of W per-layer tensors, W = the widest group's layer count. The hidden-state group has
one layer, so each of its blocks costs W pages, W - 1 of them unused (Qwen3.6-27B's bf16-state
look-alike, W = 16: one 262,144-token request is billed 224 GiB with extraction, 16 GiB
without).
How: when a hidden-state group shares the common page with the model's groups, every group is
split into one-layer groups with the same spec. The pool is then one page wide, and each
layer, the hidden-state one included, is billed its own pages: the same bytes for the model's
layers as before, and n_ids x hidden x dtype bytes per token for the hidden states. Their
block size becomes the most tokens that fit one page; with prefix caching on (vLLM < 0.22), the
most that also divide the engine block size, so cache hits keep the model's granularity, at the
cost of padding.
vLLM 0.33's `KVCacheConfigBuilder` is chosen by the platform, so replacing it would override
a vendor's builder; wrapping the default grouping composes with any builder that uses it.
A hidden-state group already as wide as the model's groups (`hidden-states-wide-group`,
opt-in, vLLM < 0.22) uses every page of its blocks: then nothing is split.
Upstream: vLLM PR 56822 (open) splits groups the same way.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from speculators_hybrid.registry import Patch, Target, argument
from speculators_hybrid.vllm_patches._targets import (
    GROUPS,
    GROUPS_BEFORE_022,
    PLANNING,
    PLANNING_GROUPS,
    UTILS,
    is_hidden,
)

logger = logging.getLogger("vllm.speculators_hybrid")


def one_layer_groups(vllm_config: Any, groups: list[Any]) -> list[Any]:
    """The groups split one layer each, the hidden states' block refitted; else unchanged."""
    from speculators_hybrid.vllm_patches.engine_block import ENGINE_BLOCK
    from speculators_hybrid.vllm_patches.spec import fit_to_page

    hidden = [g for g in groups if is_hidden(g.kv_cache_spec)]
    model = [g for g in groups if not is_hidden(g.kv_cache_spec)]
    pages = {g.kv_cache_spec.page_size_bytes for g in groups}
    if not hidden or not model or len(pages) != 1:
        return groups  # nothing shares a padded page (e.g. 0.33's packed layouts)
    page = pages.pop()
    cache = vllm_config.cache_config
    engine_block = ENGINE_BLOCK.get(id(cache), min(g.kv_cache_spec.block_size for g in model))
    caching = bool(cache.enable_prefix_caching)
    refit = [
        replace(g, kv_cache_spec=fit_to_page(g.kv_cache_spec, page, engine_block, caching))
        for g in hidden
    ]
    width = max(len(g.layer_names) for g in model)
    if all(len(g.layer_names) == width for g in hidden):
        return model + refit  # as wide as the model's groups (hidden-states-wide-group)
    if any(len(g.layer_names) > 1 for g in hidden):
        logger.info(
            "speculators-hybrid: the hidden-state group has %s layers, the model's groups %d; "
            "splitting every group into one-layer groups.",
            [len(g.layer_names) for g in hidden],
            width,
        )
    split = [replace(g, layer_names=[name]) for g in model for name in g.layer_names]
    split_hidden = [replace(g, layer_names=[name]) for g in refit for name in g.layer_names]
    return split + split_hidden


def _split(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    groups = wrapped(*args, **kwargs)
    return one_layer_groups(argument(args, kwargs, 0, "vllm_config"), groups)


PATCH = Patch(
    id="hidden-states-own-page-size",
    project="vllm",
    versions=">=0.20",
    fixed_upstream="vLLM PR 56822 (open)",
    why=__doc__ or "",
    targets=(
        Target(
            UTILS,
            "get_kv_cache_groups",
            _split,
            (*GROUPS_BEFORE_022, *GROUPS),
            versions="<0.33",
        ),
        Target(PLANNING, "get_kv_cache_groups", _split, PLANNING_GROUPS, versions=">=0.33"),
    ),
)
