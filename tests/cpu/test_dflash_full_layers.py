"""dflash-full-layers-non-causal: a DFlash drafter's full-attention layers serve non-causal.

speculators 0.9.0 trains a full-attention draft layer (`--full-attention-indices`) with its
draft block non-causal and a sliding-window one causal (`sliding_window_non_causal: false`).
vLLM's own `SpeculativeConfig` builds the draft config, and vLLM's own per-layer rule
(`qwen3_dflash._dflash_layer_causal`, which each draft layer's attention is built with) says
which layers are causal.
"""

from __future__ import annotations

from typing import Any

import pytest
from conftest import needs
from test_dflash_causal import draft_config, drafter

from speculators_hybrid.vllm_patches import dflash_full_layers
from speculators_hybrid.vllm_patches.dflash_causal import SLIDING

fixed = needs(dflash_full_layers.PATCH.id)
FULL = "full_attention"


def mixed() -> dict[str, Any]:
    """Layer 0 full attention, layer 1 sliding window (`--full-attention-indices 0`)."""
    config = drafter(SLIDING)
    config["transformer_layer_config"]["layer_types"] = [FULL, SLIDING]
    return config


def served_causal(config: dict[str, Any]) -> list[bool]:
    """Each draft layer's causality as vLLM builds the drafter's attention."""
    from vllm.config import VllmConfig, set_current_vllm_config

    with set_current_vllm_config(VllmConfig()):  # the model module builds custom ops at import
        from vllm.model_executor.models.qwen3_dflash import _dflash_layer_causal

    hf_config = draft_config(config)
    return [_dflash_layer_causal(hf_config, i) for i in range(hf_config.num_hidden_layers)]


@fixed
def test_stock_vllm_serves_full_attention_layers_causal(no_shim):
    assert served_causal(drafter(FULL)) == [True, True]
    assert served_causal(mixed()) == [True, True]


@fixed
def test_with_shim_each_layer_is_served_as_trained(shim):
    assert served_causal(drafter(FULL)) == [False, False]
    assert served_causal(mixed()) == [False, True]
    assert served_causal(drafter(SLIDING)) == [True, True]  # all sliding: causal, as before


@pytest.mark.parametrize(
    ("non_causal", "types", "expected"),
    [
        (False, [FULL, FULL], True),
        (False, [FULL, SLIDING], True),
        (False, [SLIDING, SLIDING], False),
        (True, [FULL, SLIDING], False),  # every block non-causal: vLLM's causal=False is right
        (None, [FULL, FULL], False),  # older speculators: no such field, trained non-causal
    ],
)
def test_has_non_causal_layers(non_causal, types, expected):
    config_dict = {} if non_causal is None else {"sliding_window_non_causal": non_causal}
    got = dflash_full_layers.has_non_causal_layers(config_dict, {"layer_types": types})
    assert got is expected
