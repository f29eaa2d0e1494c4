"""dflash-causal-draft-blocks: a DFlash drafter trained with causal draft blocks is served so.

The drafter's config.json is the shape speculators 0.9.0 saves with its defaults: every draft
layer a sliding-window layer (`layer_types`, `sliding_window` 2048) and
`sliding_window_non_causal: false`, so speculators masked each draft block causally. vLLM's own
`SpeculativeConfig` builds the draft config from it, as `LLM(..., speculative_config=...)` does;
its DFlash proposer masks the block as `dflash_config["causal"]` says (non-causal when absent).
On 0.20-0.22, whose proposer reads no such key, the proposer's own
`build_per_group_and_layer_attn_metadata` runs on a proposer carrying that draft config, with
the metadata `set_inputs_first_pass` makes there (`causal=False`); the attention backend's
metadata builder (a GPU kernel's on a real server) is a stand-in that records what it is given.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import VLLM, model_dir, needs, scratch
from packaging.version import Version
from test_dflash_rope import speculators_config

from speculators_hybrid.vllm_patches import dflash_causal

fixed = needs(dflash_causal.PATCH.id)


def drafter(layer_type: str) -> dict[str, Any]:
    """speculators 0.9.0's DFlash config with every draft layer of this type."""
    config = speculators_config("dflash", model_dir("tiny"))
    layer = config["transformer_layer_config"]
    layer["num_hidden_layers"] = 2
    layer["layer_types"] = [layer_type] * 2
    layer["sliding_window"] = 2048
    layer["use_sliding_window"] = layer_type == dflash_causal.SLIDING
    config["sliding_window_non_causal"] = False
    return config


def speculative_config(config: dict[str, Any]) -> Any:
    """vLLM's SpeculativeConfig for this drafter on the tiny Qwen3.5 target."""
    from vllm.config import ModelConfig, ParallelConfig, SpeculativeConfig

    folder = scratch("dflash-causal-")
    (folder / "config.json").write_text(json.dumps(config))
    spec = SpeculativeConfig(
        target_model_config=ModelConfig(model=model_dir("tiny"), skip_tokenizer_init=True),
        target_parallel_config=ParallelConfig(),
        model=str(folder),
        method="dflash",
        num_speculative_tokens=3,
    )
    return spec


def draft_config(config: dict[str, Any]) -> Any:
    """The drafter's transformers config as vLLM builds it for the tiny Qwen3.5 target."""
    return speculative_config(config).draft_model_config.hf_config


def causal(hf_config: Any) -> bool:
    """What vLLM's DFlash proposer reads (`dflash_config.get("causal", False)`)."""
    return bool(hf_config.dflash_config.get("causal", False))


@fixed
def test_stock_vllm_serves_the_blocks_non_causal(no_shim):
    assert not causal(draft_config(drafter(dflash_causal.SLIDING)))


@fixed
def test_with_shim_the_blocks_are_causal_as_trained(shim):
    assert causal(draft_config(drafter(dflash_causal.SLIDING)))


def test_vllm_from_026_does_the_same_itself(no_shim):
    import vllm

    if Version(vllm.__version__).release < (0, 26):
        pytest.skip(f"vLLM {vllm.__version__}: before 0.26.0 the plugin sets it")
    assert causal(draft_config(drafter(dflash_causal.SLIDING)))


@fixed
def test_full_attention_drafter_stays_non_causal(shim):
    assert not causal(draft_config(drafter("full_attention")))


@pytest.mark.parametrize(
    ("non_causal", "types", "expected"),
    [
        (False, ["sliding_attention"] * 2, True),
        (True, ["sliding_attention"] * 2, False),
        (None, ["sliding_attention"] * 2, False),  # older speculators: no such field
        (False, ["sliding_attention", "full_attention"], False),
        (False, [], False),
    ],
)
def test_trained_causal(non_causal, types, expected):
    config_dict = {} if non_causal is None else {"sliding_window_non_causal": non_causal}
    assert dflash_causal.trained_causal(config_dict, {"layer_types": types}) is expected


before_023 = pytest.mark.skipif(
    VLLM >= Version("0.23"), reason=f"vLLM {VLLM}'s proposer reads dflash_config['causal']"
)


class RecordingBuilder:
    """Stands in for the attention backend's metadata builder: keeps what the proposer gives."""

    def __init__(self) -> None:
        self.given: list[bool] = []

    def build_for_drafting(self, common_attn_metadata: Any, draft_index: int) -> Any:
        self.given.append(common_attn_metadata.causal)
        return SimpleNamespace(causal=common_attn_metadata.causal)


def block_metadata(config: dict[str, Any], causal: bool = False) -> tuple[list[bool], Any]:
    """What the attention builder gets for one draft block: vLLM 0.20-0.22's proposer method on
    a proposer with this drafter, from the block metadata its `set_inputs_first_pass` makes."""
    import torch
    from vllm.v1.attention.backend import CommonAttentionMetadata
    from vllm.v1.spec_decode.dflash import DFlashProposer
    from vllm.v1.worker.utils import AttentionGroup

    proposer = object.__new__(DFlashProposer)  # its __init__ needs a GPU; these two fields suffice
    proposer.draft_model_config = speculative_config(config).draft_model_config
    builder = RecordingBuilder()
    proposer.draft_attn_groups = [
        AttentionGroup(
            backend=None,
            layer_names=["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"],
            kv_cache_spec=None,
            kv_cache_group_id=1,
            metadata_builders=[builder],
        )
    ]
    block = 4  # the bonus token and 3 mask tokens
    cad = CommonAttentionMetadata(
        query_start_loc=torch.tensor([0, block], dtype=torch.int32),
        query_start_loc_cpu=torch.tensor([0, block], dtype=torch.int32),
        seq_lens=torch.tensor([16 + block], dtype=torch.int32),
        num_reqs=1,
        num_actual_tokens=block,
        max_query_len=block,
        max_seq_len=16 + block,
        block_table_tensor=torch.zeros((1, 2), dtype=torch.int32),
        slot_mapping=torch.arange(16, 16 + block),
        causal=causal,
    )
    _, per_layer = proposer.build_per_group_and_layer_attn_metadata(cad)
    return builder.given, per_layer


@before_023
def test_stock_proposer_builds_the_block_non_causal(no_shim):
    given, per_layer = block_metadata(drafter(dflash_causal.SLIDING))
    assert given == [False]
    assert all(m.causal is False for m in per_layer.values())


@before_023
def test_stock_proposer_refuses_causal_block_metadata(no_shim):
    with pytest.raises(AssertionError, match="non-causal"):
        block_metadata(drafter(dflash_causal.SLIDING), causal=True)


@before_023
@fixed
def test_with_shim_the_proposer_builds_the_block_causal(shim):
    given, per_layer = block_metadata(drafter(dflash_causal.SLIDING))
    assert given == [True]
    assert len(per_layer) == 2 and all(m.causal is True for m in per_layer.values())


@before_023
@fixed
def test_with_shim_a_full_attention_drafter_keeps_non_causal_blocks(shim):
    given, _ = block_metadata(drafter("full_attention"))
    assert given == [False]
    with pytest.raises(AssertionError, match="non-causal"):  # the proposer's own check stays
        block_metadata(drafter("full_attention"), causal=True)
