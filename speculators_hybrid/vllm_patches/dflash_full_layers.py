"""A speculators DFlash drafter's full-attention layers are served non-causal, as trained (0.26+).

Why: speculators 0.9.0 masks a DFlash draft block non-causally in a full-attention layer and
causally in a sliding-window layer unless `sliding_window_non_causal` (`models/dflash/attention.py`
`create_anchor_block_mask_mod`: `non_causal = sliding_window is None or
sliding_window_non_causal`); a drafter trained with `--full-attention-indices` saves those layers
as "full_attention" in `layer_types` and `"sliding_window_non_causal": false`. From 0.26.0 vLLM
sets `dflash_config["causal"] = not sliding_window_non_causal` for every speculators DFlash config
(`transformers_utils/configs/speculators/algos.py` `update_dflash`), and that key overrides every
layer's own causality (`model_executor/models/qwen3_dflash.py` `_dflash_layer_causal`). So a
drafter with any full-attention layer is served with those layers causal, which they never were
in training: it loads, serves, and accepts fewer tokens, silently. Without the key, vLLM resolves
each layer from `layer_types` (sliding causal, full non-causal): exactly speculators' masks.
How: where vLLM turns a speculators config into the drafter's transformers config
(`SpeculatorsConfig.extract_transformers_pre_trained_config`), a `dflash` or `dflash2` drafter
whose config says `sliding_window_non_causal: false` and which has a layer other than a
sliding-window one loses `dflash_config["causal"]`, with one log line; a drafter whose layers
are all sliding-window layers keeps `causal: true` (what vLLM < 0.26 needs
`dflash-causal-draft-blocks` for).
Upstream: none yet (vLLM 0.34.0 sets the key the same way).
"""

from __future__ import annotations

import logging

from speculators_hybrid.registry import Patch, Target
from speculators_hybrid.vllm_patches._targets import (
    EXTRACT,
    EXTRACT_NAME,
    SPECULATORS_CONFIG,
    after_dflash_extract,
)
from speculators_hybrid.vllm_patches.dflash_causal import SLIDING

logger = logging.getLogger("vllm.speculators_hybrid")


def has_non_causal_layers(config_dict: dict, pre_trained_config: dict) -> bool:
    """Whether speculators trained some of this DFlash drafter's layers non-causal while the
    rest were causal or none at all (`sliding_window_non_causal: false`, a non-sliding layer)."""
    layer_types = pre_trained_config.get("layer_types") or []
    return config_dict.get("sliding_window_non_causal") is False and any(
        t != SLIDING for t in layer_types
    )


def _layers_as_trained(config_dict: dict, config: dict) -> None:
    dflash = config.get("dflash_config")
    if (
        isinstance(dflash, dict)
        and "causal" in dflash
        and has_non_causal_layers(config_dict, config)
    ):
        del dflash["causal"]
        logger.info(
            "speculators-hybrid: dflash drafter: each draft layer is served causal or not as "
            "speculators trained it (full-attention layers non-causal)"
        )


PATCH = Patch(
    id="dflash-full-layers-non-causal",
    project="vllm",
    versions=">=0.26",
    fixed_upstream="none yet",
    why=__doc__ or "",
    targets=(
        Target(SPECULATORS_CONFIG, EXTRACT_NAME, after_dflash_extract(_layers_as_trained), EXTRACT),
    ),
)
