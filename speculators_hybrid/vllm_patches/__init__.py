"""Runtime patches for vLLM, one module per patched area. `PATCHES` lists them all."""

from __future__ import annotations

from speculators_hybrid.registry import Patch
from speculators_hybrid.vllm_patches import (
    chunked_prompts,
    eagle3_falcon_h1,
    eagle3_granite,
    eagle3_jamba,
    eagle3_lfm2,
    eagle3_lfm2_moe,
    eagle3_nemotron_h,
    eagle3_zamba2,
    engine_block,
    extraction_input,
    file_names,
    folder_faults,
    granite_layer_names,
    hidden_group,
    hidden_read,
    hidden_write,
    hma_config,
    layer_zero,
    llm_wait,
    mamba_all_mode,
    own_page,
    prefill_only,
    prefix_caching,
    prefix_hit,
    provenance,
    runner_v1,
    text_only,
    whole_prompts,
    wide_hidden,
)

PATCHES: tuple[Patch, ...] = (
    hma_config.PATCH,
    hidden_group.PATCH,
    hidden_write.PATCH,
    llm_wait.PATCH,
    engine_block.PATCH,
    prefix_caching.PATCH,
    mamba_all_mode.PATCH,
    chunked_prompts.PATCH,  # after prefix_caching: wraps outside it, names our connector first
    prefix_hit.PATCH,
    hidden_read.PATCH,
    hidden_read.PAD_PATCH,
    provenance.PATCH,
    file_names.PATCH,
    whole_prompts.PATCH,
    folder_faults.PATCH,
    extraction_input.PATCH,
    layer_zero.PATCH,
    runner_v1.PATCH,
    granite_layer_names.PATCH,
    eagle3_granite.PATCH,
    eagle3_falcon_h1.PATCH,
    eagle3_lfm2.PATCH,
    eagle3_lfm2_moe.PATCH,
    eagle3_zamba2.PATCH,
    eagle3_jamba.PATCH,
    eagle3_nemotron_h.PATCH,
    prefill_only.PATCH,
    wide_hidden.PATCH,
    text_only.PATCH,  # registers architectures (model_registration), wraps nothing
    own_page.PATCH,  # after the patches it wraps on top of (get_kv_cache_groups); keep last
)
