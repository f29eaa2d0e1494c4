"""Keep the hybrid KV cache manager on for hidden-state extraction (vLLM < 0.22).

Why: any `--kv-transfer-config` makes vLLM turn the hybrid KV cache manager off
(`VllmConfig.__post_init__`), and a hybrid target then dies at startup with "Hybrid KV cache
manager is disabled but failed to convert the KV cache specs to one unified type". vLLM's
`ExampleHiddenStatesConnector` is not `SupportsHMA`, so turning it back on is refused too.
How: before vLLM decides, for an `extract_hidden_states` run on a hybrid model, name our
multi-group connector (same file contract) in place of `ExampleHiddenStatesConnector` and say
"keep it on" where the user expressed no preference. Non-hybrid targets are untouched.
Upstream: PR 39949 (vLLM 0.22.0) keeps the manager on for `SupportsHMA` connectors and makes
the stock connector multi-group.
"""

from __future__ import annotations

import logging
from typing import Any

from speculators_hybrid.registry import Patch, Target

logger = logging.getLogger("vllm.speculators_hybrid")

STOCK_CONNECTOR = "ExampleHiddenStatesConnector"
CONNECTOR = "HybridHiddenStatesConnector"
CONNECTOR_MODULE = "speculators_hybrid.vllm_patches.connector"


def is_extraction(config: Any) -> bool:
    """`config` (a VllmConfig) runs speculators' hidden-state extraction."""
    spec = getattr(config, "speculative_config", None)
    return getattr(spec, "method", None) == "extract_hidden_states"


# VllmConfig.__post_init__ from 0.22, which several patches wrap (prefix_caching.py,
# chunked_prompts.py, mamba_all_mode.py)
POST_INIT_FINGERPRINTS = (
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
)


def is_hybrid_extraction(config: Any) -> bool:
    model = getattr(config, "model_config", None)
    return is_extraction(config) and model is not None and bool(model.is_hybrid)


def name_our_connector(config: Any, why: str) -> bool:
    """Hybrid extraction with the stock connector (no module path of the user's): name ours
    (same file contract) in its place. Whether this is hybrid extraction with a connector."""
    transfer = getattr(config, "kv_transfer_config", None)
    if transfer is None or not is_hybrid_extraction(config):
        return False
    if transfer.kv_connector == STOCK_CONNECTOR and not transfer.kv_connector_module_path:
        transfer.kv_connector = CONNECTOR
        transfer.kv_connector_module_path = CONNECTOR_MODULE
        logger.info(
            "speculators-hybrid: hybrid target, using %s.%s (%s; same file contract) for %s",
            CONNECTOR_MODULE,
            CONNECTOR,
            why,
            STOCK_CONNECTOR,
        )
    return True


def _before_post_init(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    if name_our_connector(instance, "multi-group"):
        scheduler = instance.scheduler_config
        if scheduler.disable_hybrid_kv_cache_manager is None:
            from vllm.platforms import current_platform

            if current_platform.support_hybrid_kv_cache():
                scheduler.disable_hybrid_kv_cache_manager = False
    return wrapped(*args, **kwargs)


PATCH = Patch(
    id="keep-hma-for-extraction",
    project="vllm",
    versions=">=0.20,<0.22",
    fixed_upstream="vLLM PR 39949, released in 0.22.0",
    why=__doc__ or "",
    targets=(
        Target(
            module="vllm.config.vllm",
            attr="VllmConfig.__post_init__",
            wrapper=_before_post_init,
            fingerprints=("802c9999fd991f14", "ea59cc078b35dc5f"),  # 0.20.0-0.20.2, 0.21.0
        ),
    ),
)
