"""Prefix caching off for hybrid hidden-state extraction (vLLM >= 0.22).

Why: measured on an H200 with vLLM 0.25.0 (with `hidden-block-divides-engine-block`, without
which it does not start): a prompt whose first 1,200 tokens hit the prefix cache of an earlier
1,500-token prompt, prefilled in 480-token chunks, came back with hidden states far from a
HuggingFace forward (per-token cosine down to 0.47 at the last layer id), while hits that
ended on a chunk boundary were right. Training data must not be silently wrong, and extraction
gains little from prefix caching (each prompt is read once).
How: before vLLM builds its config, an `extract_hidden_states` run on a hybrid model gets
`enable_prefix_caching=False`, with a log line saying why. On vLLM 0.20-0.21 our own
connector path keeps prefix caching on: there it was measured correct (tests/gpu).
Root cause (vLLM 0.24-0.26), found since: the scheduler resumed a hit where the attention
layers had state but the GDN layers had not; hidden-states-consistent-prefix-hit (prefix_hit.py)
fixes that. This patch stays until a GPU run shows matching hidden states with the fix.
Upstream: none yet.
"""

from __future__ import annotations

import logging
from typing import Any

from speculators_hybrid.registry import Patch, Target
from speculators_hybrid.vllm_patches.hma_config import is_hybrid_extraction

logger = logging.getLogger("vllm.speculators_hybrid")


def _caching_off(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    cache = getattr(instance, "cache_config", None)
    if cache is not None and cache.enable_prefix_caching and is_hybrid_extraction(instance):
        cache.enable_prefix_caching = False
        logger.warning(
            "speculators-hybrid: prefix caching turned off for hidden-state extraction from a "
            "hybrid model: on this vLLM, prefix-cache hits gave wrong hidden states "
            "(speculators_hybrid/vllm_patches/prefix_caching.py)"
        )
    return wrapped(*args, **kwargs)


PATCH = Patch(
    id="no-prefix-caching-for-hybrid-extraction",
    project="vllm",
    versions=">=0.22",
    fixed_upstream="none yet",
    why=__doc__ or "",
    targets=(
        Target(
            "vllm.config.vllm",
            "VllmConfig.__post_init__",
            _caching_off,
            (
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
            ),
        ),
    ),
)
