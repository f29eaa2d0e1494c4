"""hidden-block-divides-engine-block and no-prefix-caching-for-hybrid-extraction (vLLM >= 0.22):
vLLM's own extraction planning through the engine core's block-size steps and the real
scheduler."""

from __future__ import annotations

import pytest
from conftest import NO_CHUNKED_PREFILL, engine_config, engine_scheduler, needs

from speculators_hybrid import planning

pytestmark = [
    needs("hidden-block-divides-engine-block"),
    pytest.mark.skipif(
        NO_CHUNKED_PREFILL, reason="vLLM 0.22-0.23: no prefix caching for hybrid extraction"
    ),
]

MEMORY = 32 << 30


def _hidden(kv):
    from vllm.v1.kv_cache_interface import HiddenStateCacheSpec

    return [g for g in kv.kv_cache_groups if isinstance(g.kv_cache_spec, HiddenStateCacheSpec)]


def test_without_shim_prefix_caching_breaks_the_engine_block_size(no_shim):
    config = engine_config(prefix_caching=True, max_model_len=8192)
    kv = planning.plan(config, planning.layer_specs(config), MEMORY)
    model_block = config.cache_config.block_size
    (hidden,) = _hidden(kv)
    assert hidden.kv_cache_spec.block_size < model_block
    try:
        scheduler, _ = engine_scheduler(config, kv)
    except AssertionError as exc:  # 0.25.0: the crash reported for prefix caching
        assert "divisible by hash_block_size" in str(exc)
        return
    # 0.29/0.33 start, but with the hidden group's block as the engine's: Mamba prefill
    # chunks are aligned to it instead of the model's block.
    assert config.cache_config.block_size == hidden.kv_cache_spec.block_size != model_block


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_with_shim_the_engine_keeps_the_models_block_size(shim, tp):
    import vllm

    from speculators_hybrid.vllm_patches.prefix_caching import PATCH as NO_PREFIX_CACHING

    config = engine_config(prefix_caching=True, max_model_len=8192, tp=tp)
    # kept on as asked, but on 0.22-0.23, planned here without chunked prefill (their stock
    # connector): no-prefix-caching-for-hybrid-extraction turns it off there.
    kept = not NO_PREFIX_CACHING.needed_for(vllm.__version__)
    assert config.cache_config.enable_prefix_caching is kept
    kv = planning.plan(config, planning.layer_specs(config), MEMORY)
    model_block = config.cache_config.block_size
    (hidden,) = _hidden(kv)
    assert hidden.layer_names == ["cache_only_layers.64"]
    assert (
        hidden.kv_cache_spec.page_size_bytes == kv.kv_cache_groups[0].kv_cache_spec.page_size_bytes
    )
    scheduler, request = engine_scheduler(config, kv)
    assert config.cache_config.block_size == model_block
    scheduler.add_request(request("r", list(range(1, 3 * model_block + 7))))
    out = scheduler.schedule()
    assert out.num_scheduled_tokens["r"] > 0


@pytest.mark.shim_only  # the shim's bookkeeping (a patched vLLM keeps the block in its source)
def test_the_engine_block_is_forgotten_with_its_config(shim):
    """The engine block is remembered per CacheConfig by id: a config planned and then dropped
    leaves nothing a later config at the same address would take for its own (CI on 776dd20:
    a plain plan's scheduler aligned Mamba prefill to another model's block)."""
    import gc

    from speculators_hybrid.vllm_patches.engine_block import ENGINE_BLOCK

    config = engine_config(prefix_caching=True, max_model_len=8192)
    kv = planning.plan(config, planning.layer_specs(config), MEMORY)
    key = id(config.cache_config)
    assert ENGINE_BLOCK[key] == min(
        g.kv_cache_spec.block_size for g in kv.kv_cache_groups if g not in _hidden(kv)
    )
    del config, kv
    gc.collect()
    assert key not in ENGINE_BLOCK
