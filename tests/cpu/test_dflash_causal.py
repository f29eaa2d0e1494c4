"""dflash-causal-draft-blocks: a DFlash drafter trained with causal draft blocks is served so.

The drafter's config.json is the shape speculators 0.9.0 saves with its defaults: every draft
layer a sliding-window layer (`layer_types`, `sliding_window` 2048) and
`sliding_window_non_causal: false`, so speculators masked each draft block causally. vLLM's own
`SpeculativeConfig` builds the draft config from it, as `LLM(..., speculative_config=...)` does;
its DFlash proposer masks the block as `dflash_config["causal"]` says (non-causal when absent).
On 0.20-0.22, whose stock proposer reads no such key, vLLM's DFlash proposer is built on the
CPU for that draft config, makes a draft block's metadata (`set_inputs_first_pass`; stock:
`causal=False`) and each layer's from it (`build_per_group_and_layer_attn_metadata`). Two GPU
parts are stand-ins: the Triton kernel that fills the proposer's input buffers (the metadata
does not depend on them) and the attention backend's metadata builder, which records what it is
given. Against vLLM patched by patches/vllm the proposer's own code makes the blocks causal.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import VLLM, model_dir, needs, scratch
from packaging.version import Version
from upstream_worker import without

from speculators_hybrid.models import drafter_config
from speculators_hybrid.vllm_patches import dflash_causal

fixed = needs(dflash_causal.PATCH.id)


def drafter(layer_type: str) -> dict[str, Any]:
    """speculators 0.9.0's DFlash config with every draft layer of this type."""
    return drafter_config(model_dir("tiny"), layer_types=[layer_type] * 2)


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


class NoKernel:
    """Stands in for the Triton kernel that fills the proposer's GPU buffers (`kernel[grid](...)`):
    the block's metadata does not depend on what it writes."""

    def __getitem__(self, grid: Any) -> Any:
        return lambda **buffers: None


@pytest.fixture
def no_gpu_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """`set_inputs_first_pass` without its Triton kernel (not installed on the CPU)."""
    from vllm.v1.spec_decode import dflash

    monkeypatch.setattr(dflash, "copy_and_expand_dflash_inputs_kernel", NoKernel())
    sizes = SimpleNamespace(
        next_power_of_2=lambda n: 1 << (n - 1).bit_length(), cdiv=lambda a, b: -(-a // b)
    )
    monkeypatch.setattr(dflash, "triton", sizes)


def block_metadata(config: dict[str, Any], causal: bool | None = None) -> tuple[list[bool], Any]:
    """What the attention builder gets for one draft block of this drafter: vLLM 0.20-0.22's
    proposer, built on the CPU, builds it from the metadata its `set_inputs_first_pass` makes
    for one request with 2 verified tokens (or, with `causal`, from block metadata that says so)."""
    import torch
    from vllm.config import VllmConfig
    from vllm.v1.attention.backend import CommonAttentionMetadata
    from vllm.v1.spec_decode.dflash import DFlashProposer
    from vllm.v1.worker.utils import AttentionGroup

    spec = speculative_config(config)
    vllm_config = VllmConfig(model_config=spec.target_model_config, speculative_config=spec)
    proposer = DFlashProposer(vllm_config, torch.device("cpu"))
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
    verified = 2  # the target's tokens of this step: the drafter's context
    cad = CommonAttentionMetadata(
        query_start_loc=torch.tensor([0, verified], dtype=torch.int32),
        query_start_loc_cpu=torch.tensor([0, verified], dtype=torch.int32),
        seq_lens=torch.tensor([16], dtype=torch.int32),
        num_reqs=1,
        num_actual_tokens=verified,
        max_query_len=verified,
        max_seq_len=16,
        block_table_tensor=torch.zeros((1, 2), dtype=torch.int32),
        slot_mapping=torch.arange(16 - verified, 16),
        causal=True,
    )
    if causal is None:
        _, _, cad = proposer.set_inputs_first_pass(
            target_token_ids=torch.tensor([5, 6]),
            next_token_ids=torch.tensor([7]),
            target_positions=torch.arange(16 - verified, 16),
            target_hidden_states=torch.zeros(verified, proposer.hidden_size),
            token_indices_to_sample=None,
            cad=cad,
            num_rejected_tokens_gpu=None,
        )
        assert cad.num_actual_tokens == 1 + 3  # the bonus token and 3 mask tokens
    else:
        cad = cad.replace(causal=causal)
    _, per_layer = proposer.build_per_group_and_layer_attn_metadata(cad)
    return builder.given, per_layer


@before_023
def test_stock_proposer_builds_the_block_non_causal(no_gpu_kernel):
    with without(dflash_causal.PATCH.id):  # the drafter's 1-D RoPE fix stays (else refused)
        given, per_layer = block_metadata(drafter(dflash_causal.SLIDING))
    assert given == [False]
    assert all(m.causal is False for m in per_layer.values())


@before_023
def test_stock_proposer_refuses_causal_block_metadata():
    with without(dflash_causal.PATCH.id), pytest.raises(AssertionError, match="non-causal"):
        block_metadata(drafter(dflash_causal.SLIDING), causal=True)


@before_023
@fixed
def test_with_shim_the_proposer_builds_the_block_causal(shim, no_gpu_kernel):
    given, per_layer = block_metadata(drafter(dflash_causal.SLIDING))
    assert given == [True]
    assert len(per_layer) == 2 and all(m.causal is True for m in per_layer.values())


@before_023
@fixed
def test_with_shim_a_full_attention_drafter_keeps_non_causal_blocks(shim, no_gpu_kernel):
    given, _ = block_metadata(drafter("full_attention"))
    assert given == [False]
    with pytest.raises(AssertionError, match="non-causal"):  # the proposer's own check stays
        block_metadata(drafter("full_attention"), causal=True)
