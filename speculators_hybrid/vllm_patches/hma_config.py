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
from speculators_hybrid.vllm_patches._targets import is_hybrid_extraction

logger = logging.getLogger("vllm.speculators_hybrid")

STOCK_CONNECTOR = "ExampleHiddenStatesConnector"
CONNECTOR = "HybridHiddenStatesConnector"
CONNECTOR_MODULE = "speculators_hybrid.vllm_patches.connector"


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
