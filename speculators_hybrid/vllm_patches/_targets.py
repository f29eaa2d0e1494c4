"""vLLM functions that more than one patch wraps, and what those patches ask of a config.

A fingerprint belongs to the upstream function, not to the patch that wraps it: each tuple here
lists the accepted fingerprints of one function (release ranges in the comments) and every
patch wrapping it takes them from here. Where a patch covers fewer releases, it takes the
tuple for its releases.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from speculators_hybrid.registry import argument

CONFIG = "vllm.config.vllm"
UTILS = "vllm.v1.core.kv_cache_utils"
PLANNING = "vllm.v1.core.kv_cache_planning"
STOCK_CONNECTOR = "vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector"

# VllmConfig.__post_init__ from 0.22 (prefix_caching, chunked_prompts, mamba_all_mode, fp8_files)
POST_INIT = (
    "001a72ffb02dddaf",  # 0.22.0-0.22.1
    "a0518c753537dae1",  # 0.24.0
    "ed3a733f270eba53",  # 0.25.0-0.25.1
    "38fbe3c6e8976849",  # 0.29.0
    "664c26a2b4f177f6",  # 0.33.0
    "8583df23984206bf",  # 0.23.0
    "393699e663fc0710",  # 0.26.0
    "d6977c46ecfcd821",  # 0.27.0-0.27.1
    "1969c7f5d3ea7f03",  # 0.28.0
    "eae90b3ca094c338",  # 0.30.0
    "f7c2967b5256a6a3",  # 0.31.0
    "7623a01408c594f0",  # 0.32.0
    "460c9ff29c879a83",  # 0.34.0
)

# VllmConfig.validate_block_size (engine_block; hidden_group before 0.22)
VALIDATE_BLOCK_SIZE_BEFORE_022 = (
    "2fbcd62a2770eb21",  # 0.20.0-0.20.2, 0.25.0-0.26.0
    "154d40b568da2567",  # 0.21.0-0.24.0
)
VALIDATE_BLOCK_SIZE = (
    *VALIDATE_BLOCK_SIZE_BEFORE_022,
    "de8c36f67937d1f1",  # 0.29.0
    "ac8d23cd165c0c1b",  # 0.33.0-0.34.0
    "703fd16e769ffe79",  # 0.27.0-0.28.0
    "a9caaa80324ae0ed",  # 0.30.0-0.32.0
)

# get_kv_cache_groups in kv_cache_utils, before 0.33 (own_page; hidden_group before 0.22;
# engine_block from 0.22)
GROUPS_BEFORE_022 = ("338345488d4bac62",)  # 0.20.0-0.21.0
GROUPS = (
    "f7ed141114e6a019",  # 0.22.0-0.26.0
    "8db53be9beed11c2",  # 0.27.0-0.27.1
    "ecaf4c3a55f66a83",  # 0.28.0
    "041259e3e0196296",  # 0.29.0
    "e1cc80b67cd5a618",  # 0.30.0
    "7e1735bb593bf3ad",  # 0.31.0
    "3c5120319ade9011",  # 0.32.0
)
# get_kv_cache_groups in kv_cache_planning, from 0.33 (own_page, engine_block)
PLANNING_GROUPS = ("df8b1daaff24dd98",)  # 0.33.0-0.34.0

# ExampleHiddenStatesConnector (file_names, copy_ready, folder_faults)
BUILD_META_BEFORE_024 = ("0be466431f794cf6",)  # 0.22.0-0.23.0
BUILD_META = ("7a379fa4d2bad460",)  # 0.24.0-0.34.0
WAIT_FOR_SAVE = ("0d3c09e2b4e71fb9",)  # 0.24.0-0.34.0
SUBMIT_ASYNC_WRITE = ("3919eee304b9859f", "3bb02be9a07dc09c")  # 0.24.0-0.29.0, 0.30.0-0.34.0

# SpeculatorsConfig.extract_transformers_pre_trained_config: a speculators config.json becomes
# the drafter's transformers config (dflash_rope, dflash_causal)
SPECULATORS_CONFIG = "vllm.transformers_utils.configs.speculators.base"
EXTRACT_NAME = "SpeculatorsConfig.extract_transformers_pre_trained_config"
EXTRACT_BEFORE_031 = ("28fb1933a9cbb46b",)  # 0.20.0-0.30.0
EXTRACT = (*EXTRACT_BEFORE_031, "7095a48b8a8f390a")  # 0.31.0-0.34.0
DFLASH_TYPES = ("dflash", "dflash2")  # speculators_model_type of DFlash drafters


def after_dflash_extract(change: Callable[[dict, dict], None]) -> Callable[..., Any]:
    """A wrapper of EXTRACT_NAME that hands a DFlash drafter's speculators config and the
    transformers config vLLM made of it to `change(config_dict, config)`, which edits the latter."""

    def wrapper(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        config = wrapped(*args, **kwargs)
        config_dict = argument(args, kwargs, 0, "config_dict")
        if config_dict.get("speculators_model_type") in DFLASH_TYPES and isinstance(config, dict):
            change(config_dict, config)
        return config

    return wrapper


def is_extraction(config: Any) -> bool:
    """`config` (a VllmConfig) runs speculators' hidden-state extraction."""
    spec = getattr(config, "speculative_config", None)
    return getattr(spec, "method", None) == "extract_hidden_states"


def is_hybrid_extraction(config: Any) -> bool:
    model = getattr(config, "model_config", None)
    return is_extraction(config) and model is not None and bool(model.is_hybrid)


def is_hidden(spec: Any) -> bool:
    """`spec` is the KV-cache spec of the hidden-state layers (ours, or vLLM's from 0.22)."""
    from speculators_hybrid.vllm_patches.spec import HiddenStatesCacheSpec

    try:  # vLLM >= 0.22 has its own marker class
        from vllm.v1.kv_cache_interface import HiddenStateCacheSpec
    except ImportError:
        return isinstance(spec, HiddenStatesCacheSpec)
    return isinstance(spec, (HiddenStatesCacheSpec, HiddenStateCacheSpec))
