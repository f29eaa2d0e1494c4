"""A speculators DFlash drafter trained with causal draft blocks is served so (vLLM 0.23-0.25).

Why: speculators 0.9.0 trains every DFlash draft layer as a sliding-window layer by default
(`--sliding-window 2048`, no `--full-attention-indices`: `layer_types` all "sliding_attention"),
and masks a sliding-window layer's draft block causally unless `sliding_window_non_causal`
(`models/dflash/attention.py` `create_anchor_block_mask_mod`: `non_causal = sliding_window is None
or sliding_window_non_causal`); the saved config says `"sliding_window_non_causal": false`. vLLM's
DFlash proposer masks the block as `dflash_config["causal"]` says, non-causal when absent
(`v1/spec_decode/dflash.py`, 0.23.0-0.25.1 `self.dflash_causal`), and before 0.26.0 nothing sets
it from a speculators checkpoint (`transformers_utils/configs/speculators/algos.py`
`update_dflash`). So such a drafter is served with each draft position seeing the mask tokens
after it, which it never saw in training: it loads, serves, and accepts fewer tokens, silently.
How: where vLLM turns a speculators config into the drafter's transformers config
(`SpeculatorsConfig.extract_transformers_pre_trained_config`), a `dflash` or `dflash2` drafter
whose config says `sliding_window_non_causal: false` and whose draft layers are all
sliding-window layers gets `dflash_config["causal"] = True`, with one log line; a `causal`
already there is left alone.
Full-attention layers are trained non-causal, so a drafter with any of them is left as it is
(vLLM 0.25 refuses mixed layer types; 0.23-0.24 serve every layer alike).
Not covered here: vLLM 0.20.0-0.22.x, whose proposer builds the draft block's attention
non-causal whatever the config says; the draft layers' 2,048-token window before 0.25.0 (the
drafter attends to the whole context: the same below 2,048 tokens).
Upstream: vLLM 0.26.0 sets `causal` from `sliding_window_non_causal` in `update_dflash`.
"""

from __future__ import annotations

import logging
from typing import Any

from speculators_hybrid.registry import Patch, Target, argument
from speculators_hybrid.vllm_patches._targets import (
    EXTRACT_BEFORE_031,
    EXTRACT_NAME,
    SPECULATORS_CONFIG,
)
from speculators_hybrid.vllm_patches.dflash_rope import DFLASH_TYPES

logger = logging.getLogger("vllm.speculators_hybrid")

SLIDING = "sliding_attention"


def trained_causal(config_dict: dict, pre_trained_config: dict) -> bool:
    """Whether speculators trained this DFlash drafter's blocks causally (all layers sliding)."""
    layer_types = pre_trained_config.get("layer_types") or []
    return (
        config_dict.get("sliding_window_non_causal") is False
        and bool(layer_types)
        and all(t == SLIDING for t in layer_types)
    )


def _after_extract(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    config = wrapped(*args, **kwargs)
    config_dict = argument(args, kwargs, 0, "config_dict")
    if config_dict.get("speculators_model_type") not in DFLASH_TYPES or not isinstance(
        config, dict
    ):
        return config
    dflash = config.get("dflash_config")
    if isinstance(dflash, dict) and "causal" not in dflash and trained_causal(config_dict, config):
        dflash["causal"] = True
        logger.info(
            "speculators-hybrid: dflash drafter: its draft blocks are served causal, as "
            "speculators trained them (sliding-window layers, sliding_window_non_causal false)"
        )
    return config


PATCH = Patch(
    id="dflash-causal-draft-blocks",
    project="vllm",
    versions=">=0.23,<0.26",
    fixed_upstream="vLLM 0.26.0 (update_dflash sets dflash_config.causal)",
    why=__doc__ or "",
    targets=(Target(SPECULATORS_CONFIG, EXTRACT_NAME, _after_extract, EXTRACT_BEFORE_031),),
)
