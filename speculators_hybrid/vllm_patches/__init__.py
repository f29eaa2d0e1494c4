"""Runtime patches for vLLM, one module per patched area. `PATCHES` lists them all."""

from __future__ import annotations

from speculators_hybrid.registry import Patch
from speculators_hybrid.vllm_patches import (
    engine_block,
    hidden_group,
    hidden_write,
    hma_config,
    own_page,
    prefix_caching,
)

PATCHES: tuple[Patch, ...] = (
    hma_config.PATCH,
    hidden_group.PATCH,
    hidden_write.PATCH,
    engine_block.PATCH,
    prefix_caching.PATCH,
    own_page.PATCH,  # after the patches it wraps on top of (get_kv_cache_groups)
)
