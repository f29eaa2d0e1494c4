"""A speculators DFlash drafter trained with causal draft blocks is served so (vLLM 0.20-0.25).

Why: speculators 0.9.0 trains every DFlash draft layer as a sliding-window layer by default
(`--sliding-window 2048`, no `--full-attention-indices`: `layer_types` all "sliding_attention"),
and masks a sliding-window layer's draft block causally unless `sliding_window_non_causal`
(`models/dflash/attention.py` `create_anchor_block_mask_mod`: `non_causal = sliding_window is None
or sliding_window_non_causal`); the saved config says `"sliding_window_non_causal": false`. vLLM's
DFlash proposer masks the block as `dflash_config["causal"]` says, non-causal when absent
(`v1/spec_decode/dflash.py`, 0.23.0-0.25.1 `self.dflash_causal`), and before 0.26.0 nothing sets
it from a speculators checkpoint (`transformers_utils/configs/speculators/algos.py`
`update_dflash`). 0.20.0-0.22.1 read no such key: `DFlashProposer.set_inputs_first_pass` builds
the block's `CommonAttentionMetadata` with `causal=False` and
`build_per_group_and_layer_attn_metadata` asserts every layer's metadata non-causal. So such a
drafter is served with each draft position seeing the mask tokens after it, which it never saw
in training: it loads, serves, and accepts fewer tokens, silently.
How: where vLLM turns a speculators config into the drafter's transformers config
(`SpeculatorsConfig.extract_transformers_pre_trained_config`), a `dflash` or `dflash2` drafter
whose config says `sliding_window_non_causal: false` and whose draft layers are all
sliding-window layers gets `dflash_config["causal"] = True`, with one log line; a `causal`
already there is left alone. On 0.20.0-0.22.1, where the proposer builds the draft block's
attention metadata of such a drafter, the block's metadata says `causal=True` and the
proposer's non-causal assertion is skipped (the base proposer's method builds it); any other
drafter goes through the proposer's own method unchanged.
Full-attention layers are trained non-causal, so a drafter with any of them is left as it is
(vLLM 0.25 refuses mixed layer types; 0.20-0.24 serve every layer alike).
Not covered here: the draft layers' 2,048-token window before 0.25.0 (the drafter attends to the
whole context: the same below 2,048 tokens).
Upstream: vLLM 0.23.0 reads `dflash_config["causal"]` in the proposer; 0.26.0 sets it from
`sliding_window_non_causal` in `update_dflash`.
"""

from __future__ import annotations

import logging
from typing import Any

from speculators_hybrid.models import SLIDING
from speculators_hybrid.registry import Patch, Target
from speculators_hybrid.vllm_patches._targets import (
    EXTRACT_BEFORE_031,
    EXTRACT_NAME,
    SPECULATORS_CONFIG,
    after_dflash_extract,
)

logger = logging.getLogger("vllm.speculators_hybrid")

PROPOSER = "vllm.v1.spec_decode.dflash"
BUILD_METADATA = "DFlashProposer.build_per_group_and_layer_attn_metadata"
BUILD_METADATA_FINGERPRINTS = ("fc1281049830d5bf",)  # 0.20.0-0.22.1


def trained_causal(config_dict: dict, pre_trained_config: dict) -> bool:
    """Whether speculators trained this DFlash drafter's blocks causally (all layers sliding)."""
    layer_types = pre_trained_config.get("layer_types") or []
    return (
        config_dict.get("sliding_window_non_causal") is False
        and bool(layer_types)
        and all(t == SLIDING for t in layer_types)
    )


def _serve_causal(config_dict: dict, config: dict) -> None:
    dflash = config.get("dflash_config")
    if isinstance(dflash, dict) and "causal" not in dflash and trained_causal(config_dict, config):
        dflash["causal"] = True
        logger.info(
            "speculators-hybrid: dflash drafter: its draft blocks are served causal, as "
            "speculators trained them (sliding-window layers, sliding_window_non_causal false)"
        )


def served_causal(proposer: Any) -> bool:
    """The drafter's config asks for causal draft blocks (set by `_after_extract`)."""
    dflash = getattr(proposer.draft_model_config.hf_config, "dflash_config", None)
    return isinstance(dflash, dict) and dflash.get("causal") is True


def _causal_metadata(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    if not served_causal(instance):
        return wrapped(*args, **kwargs)
    from vllm.v1.spec_decode.dflash import DFlashProposer

    kwargs = dict(kwargs)
    cad = args[0] if args else kwargs.pop("cad")
    base = super(DFlashProposer, instance).build_per_group_and_layer_attn_metadata
    return base(cad.replace(causal=True), *args[1:], **kwargs)


PATCH = Patch(
    id="dflash-causal-draft-blocks",
    project="vllm",
    versions=">=0.20,<0.26",
    fixed_upstream="vLLM 0.26.0 (update_dflash sets dflash_config.causal)",
    why=__doc__ or "",
    targets=(
        Target(
            SPECULATORS_CONFIG,
            EXTRACT_NAME,
            after_dflash_extract(_serve_causal),
            EXTRACT_BEFORE_031,
        ),
        Target(
            PROPOSER,
            BUILD_METADATA,
            _causal_metadata,
            BUILD_METADATA_FINGERPRINTS,
            versions="<0.23",
        ),
    ),
)
