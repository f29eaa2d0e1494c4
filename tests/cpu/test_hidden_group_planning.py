"""hidden-states-own-group and keep-hma-for-extraction: vLLM's own planner, with and without us."""

from __future__ import annotations

import pytest
from conftest import IDS, MEMORY, engine_config, needs

from speculators_hybrid import planning
from speculators_hybrid.vllm_patches.hma_config import CONNECTOR, CONNECTOR_MODULE
from speculators_hybrid.vllm_patches.spec import HiddenStatesCacheSpec

pytestmark = needs("keep-hma-for-extraction", "hidden-states-own-group")

HIDDEN = "cache_only_layers.64"


def test_without_shim_startup_fails_as_reported(no_shim):
    config = engine_config()
    assert config.scheduler_config.disable_hybrid_kv_cache_manager is True
    assert config.kv_transfer_config.kv_connector == "ExampleHiddenStatesConnector"
    specs = planning.layer_specs(config)
    with pytest.raises(
        ValueError, match="failed to convert the KV cache specs to one unified type"
    ):
        planning.plan(config, specs, MEMORY)


@pytest.mark.parametrize("preset", ["qwen3.6-27b", "qwen3.6-27b-bf16-state"])
def test_without_shim_forcing_hma_fails_only_where_the_pages_do_not_divide(no_shim, preset):
    """--no-disable-hybrid-kv-cache-manager: vLLM scales the hidden layer's 16-token block
    (16 x 40,960 B) up to the state page where it divides it: the real config's 3,276,800 B
    (GDN state in float32) is 5 such pages, the bf16-state look-alike's 1,703,936 B is not."""
    config = engine_config(preset=preset)
    specs = planning.layer_specs(config)
    config.scheduler_config.disable_hybrid_kv_cache_manager = False
    if preset == "qwen3.6-27b-bf16-state":
        with pytest.raises(NotImplementedError, match="not divisible by the maximum page size"):
            planning.plan(config, specs, MEMORY)
        return
    kv = planning.plan(config, specs, MEMORY)
    (hidden,) = [g for g in kv.kv_cache_groups if g.layer_names == [HIDDEN]]
    assert hidden.kv_cache_spec.block_size == 5 * 16


def test_config_keeps_hma_and_names_our_connector(shim):
    config = engine_config()
    assert config.scheduler_config.disable_hybrid_kv_cache_manager is False
    assert config.kv_transfer_config.kv_connector == CONNECTOR
    assert config.kv_transfer_config.kv_connector_module_path == CONNECTOR_MODULE
    assert config.kv_transfer_config.kv_connector_extra_config["shared_storage_path"]


def test_non_hybrid_config_is_left_alone(shim, tmp_path):
    import json

    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["Qwen3ForCausalLM"],
                "model_type": "qwen3",
                "hidden_size": 128,
                "intermediate_size": 256,
                "num_hidden_layers": 4,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "head_dim": 32,
                "vocab_size": 512,
                "max_position_embeddings": 2048,
                "rms_norm_eps": 1e-6,
                "rope_theta": 10000.0,
                "dtype": "bfloat16",
            }
        )
    )
    config = planning.engine_config(
        planning.Setup(model=str(tmp_path), layer_ids=(1, 2, 4), max_model_len=2048)
    )
    assert config.kv_transfer_config.kv_connector == "ExampleHiddenStatesConnector"
    assert config.kv_transfer_config.kv_connector_module_path is None
    assert config.scheduler_config.disable_hybrid_kv_cache_manager is True  # vLLM's own choice


@pytest.mark.parametrize("prefix_caching", [False, True], ids=["no-prefix-cache", "prefix-cache"])
@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_hidden_states_get_a_group_of_their_own(shim, tp, prefix_caching):
    from vllm.v1.core.kv_cache_utils import resolve_kv_cache_block_sizes

    config = engine_config(tp=tp, prefix_caching=prefix_caching)
    specs = planning.layer_specs(config)
    assert isinstance(specs[HIDDEN], HiddenStatesCacheSpec)
    kv = planning.plan(config, specs, MEMORY)

    # The target's own layers keep the specs vLLM gives them without the hidden layer;
    # hidden-states-own-page-size puts each in a one-layer group.
    without = {n: s for n, s in specs.items() if n != HIDDEN}
    alone = planning.plan(config, without, MEMORY)
    assert len(alone.kv_cache_groups) == 4  # 3 GDN groups + 1 attention group of 16 layers
    layer_spec = {n: g.kv_cache_spec for g in alone.kv_cache_groups for n in g.layer_names}
    assert [(g.layer_names, g.kv_cache_spec) for g in kv.kv_cache_groups[:-1]] == [
        ([n], layer_spec[n]) for g in alone.kv_cache_groups for n in g.layer_names
    ]

    hidden = kv.kv_cache_groups[-1]
    assert hidden.layer_names == [HIDDEN]
    spec = hidden.kv_cache_spec
    assert isinstance(spec, HiddenStatesCacheSpec)
    assert (spec.num_kv_heads, spec.head_size) == (len(IDS), 5120)
    page = kv.kv_cache_groups[0].kv_cache_spec.page_size_bytes
    assert spec.page_size_bytes == page
    per_token = len(IDS) * 5120 * 2
    assert spec.block_size * per_token <= page
    most = page // per_token
    if prefix_caching:  # the largest that fits and divides the engine block
        base = config.cache_config.block_size
        assert base % spec.block_size == 0
        assert not any(base % b == 0 for b in range(spec.block_size + 1, most + 1))
    else:  # as many tokens as fit
        assert spec.block_size == most

    # The engine's block size stays the model's, and the prefix-cache hash block divides every
    # group's block (the check HybridKVCacheCoordinator asserts at start-up).
    scheduler_block, hash_block = resolve_kv_cache_block_sizes(kv, config)
    assert scheduler_block % resolve_kv_cache_block_sizes(alone, config)[0] == 0
    if prefix_caching:
        assert config.cache_config.mamba_cache_mode == "align"
        assert all(g.kv_cache_spec.block_size % hash_block == 0 for g in kv.kv_cache_groups)
        assert kv.kv_cache_groups[0].kv_cache_spec.block_size == config.cache_config.block_size


def test_extracted_bytes_fit_and_are_planned(shim):
    config = engine_config()
    kv = planning.plan(config, planning.layer_specs(config), MEMORY)
    needed = planning.max_request_bytes(config, kv)
    hidden_bytes = 262144 * len(IDS) * 5120 * 2
    assert needed > hidden_bytes


def test_every_target_matches_its_fingerprint_on_this_vllm(shim):
    import importlib

    from speculators_hybrid.plugin import PATCHER, vllm_patches
    from speculators_hybrid.versions import installed

    selected = PATCHER.select(vllm_patches())
    assert selected, f"no patch selected for vllm {installed('vllm')}"
    for patch in selected:
        for target in patch.targets_for(installed(patch.project)):
            PATCHER.verify(patch, target, importlib.import_module(target.module))
        assert patch.id in PATCHER.applied()  # armed, and every target now patched


def test_non_hybrid_planning_is_vllms_own(shim):
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec

    from speculators_hybrid.vllm_patches.spec import mark

    config = engine_config()
    config.scheduler_config.disable_hybrid_kv_cache_manager = True
    attention = FullAttentionSpec(
        block_size=16, num_kv_heads=2, head_size=64, dtype=config.model_config.dtype
    )
    hidden = MLAAttentionSpec(
        block_size=16, num_kv_heads=3, head_size=128, dtype=config.model_config.dtype
    )
    ours = planning.plan(
        config, {"a.0": attention, "a.1": attention, HIDDEN: mark(hidden)}, 1 << 30
    )
    stock = planning.plan(config, {"a.0": attention, "a.1": attention, HIDDEN: hidden}, 1 << 30)
    assert ours.num_blocks == stock.num_blocks
    assert [(g.layer_names, g.kv_cache_spec) for g in ours.kv_cache_groups] == [
        (g.layer_names, g.kv_cache_spec) for g in stock.kv_cache_groups
    ]
