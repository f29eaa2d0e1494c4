"""dflash-causal-draft-blocks: a DFlash drafter trained with causal draft blocks is served so.

The drafter's config.json is the shape speculators 0.9.0 saves with its defaults: every draft
layer a sliding-window layer (`layer_types`, `sliding_window` 2048) and
`sliding_window_non_causal: false`, so speculators masked each draft block causally. vLLM's own
`SpeculativeConfig` builds the draft config from it, as `LLM(..., speculative_config=...)` does;
its DFlash proposer masks the block as `dflash_config["causal"]` says (non-causal when absent).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import model_dir, needs, scratch
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


def draft_config(config: dict[str, Any]) -> Any:
    """The drafter's transformers config as vLLM builds it for the tiny Qwen3.5 target."""
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
    return spec.draft_model_config.hf_config


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
