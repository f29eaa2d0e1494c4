"""Prefix caching off for hybrid extraction where the connector refuses chunks (vLLM 0.22-0.23).

Why: prefix caching of a hybrid model keeps the GDN / Mamba state per block ('align' mode),
which needs chunked prefill; vLLM 0.22-0.23's ExampleHiddenStatesConnector refuses chunked
prefill. With chunked prefill on, the plugin's connector writes the files there
(hidden-states-chunked-prompts) and caching stays on; with --no-enable-chunked-prefill vLLM's
connector stays, and this patch turns caching off with a log line instead of a failed start.
History: this patch used to turn caching off for every hybrid extraction on vLLM >= 0.22, after
a GPU run of vLLM 0.25.0 gave wrong hidden states after a hit (docs/verify.md). The root
cause was the scheduler resuming a hit where the GDN layers had no state
(hidden-states-consistent-prefix-hit fixes it on 0.24-0.26; vLLM fixed it in 0.27). Since then
caching is kept on every release, proven:
- on a GPU, prefix caching on, hits of several lengths (the 1,200-token shared prefix of the
  failure among them), every file within verify's calibrated floor of transformers: vLLM 0.20.1,
  0.24.0 and 0.25.0 (tests/gpu/results/, the *-prefix-on.json runs);
- on the CPU with vLLM's real scheduler, prefix cache and connector sides, 0.22.0-0.33.0: a hit
  resumes where the GDN layers saved state (test_prefix_hit.py, test_prefix_hit_fixed.py) and
  the file after a hit holds every prompt token, equal to an uncached run's
  (test_prefix_hit_file.py). The CPU tests' model is a stand-in: they cannot see the attention
  or GDN state a hit resumes from, which only a GPU run shows (`speculators-hybrid verify`
  checks files against transformers).
vLLM issue 44485 (a file of only the newly computed tokens) is the 0.22-0.23 connector's read in
the forward pass, which a hybrid model with a hit never reaches; from 0.24 vLLM's reads the
whole block table and it does not reproduce. Models vLLM caches in 'all' Mamba mode lose caching
on 0.22-0.31 (no-prefix-caching-for-mamba-all-mode: the engine core would stop).
How: before vLLM builds its config, hybrid extraction with prefix caching on whose connector is
vLLM's own on 0.22-0.23 gets `enable_prefix_caching=False`, with a log line saying why.
Upstream: vLLM 0.24.0 (its connector takes chunked prefill, PR 43805).
"""

from __future__ import annotations

import logging
from typing import Any

from packaging.version import InvalidVersion, Version

from speculators_hybrid.registry import Patch, Target, base_version
from speculators_hybrid.vllm_patches._targets import CONFIG, POST_INIT, is_hybrid_extraction
from speculators_hybrid.vllm_patches.hma_config import CONNECTOR

logger = logging.getLogger("vllm.speculators_hybrid")
# vLLM PR 37374 made ExampleHiddenStatesConnector refuse chunked prefill; PR 43805 lifted it.
STOCK_REFUSES_CHUNKED = (Version("0.22.0"), Version("0.24.0"))
STOCK_TAKES_CHUNKS = STOCK_REFUSES_CHUNKED[1]  # before it, only our connector (chunked_prompts.py)


def stock_refuses_chunked(vllm: str | None) -> bool:
    """vLLM's own connector refuses chunked prefill in this release (0.22-0.23)."""
    try:
        v = Version(vllm) if vllm else None
    except InvalidVersion:
        return False
    return v is not None and STOCK_REFUSES_CHUNKED[0] <= v < STOCK_REFUSES_CHUNKED[1]


def _takes_chunks(config: Any) -> bool:
    """Chunked prefill, which a hybrid model's prefix caching needs, works with this config's
    connector: vLLM's from 0.24, ours on 0.22-0.23 (named there by hidden-states-chunked-prompts,
    which wraps outside this patch)."""
    import vllm

    transfer = getattr(config, "kv_transfer_config", None)
    ours = transfer is not None and transfer.kv_connector == CONNECTOR
    return ours or Version(str(base_version(vllm.__version__))) >= STOCK_TAKES_CHUNKS


def _caching_off(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    cache = getattr(instance, "cache_config", None)
    if (
        cache is not None
        and cache.enable_prefix_caching
        and is_hybrid_extraction(instance)
        and not _takes_chunks(instance)
    ):
        cache.enable_prefix_caching = False
        logger.warning(
            "speculators-hybrid: prefix caching turned off for hidden-state extraction from a "
            "hybrid model: with chunked prefill off, vLLM's own hidden-states connector writes "
            "the files here, and a hybrid model's prefix caching needs chunked prefill; leave "
            "it on to keep caching (speculators_hybrid/vllm_patches/prefix_caching.py)"
        )
    return wrapped(*args, **kwargs)


PATCH = Patch(
    id="no-prefix-caching-for-hybrid-extraction",
    project="vllm",
    versions=">=0.22,<0.24",
    fixed_upstream="vLLM 0.24.0 (its connector takes chunked prefill)",
    why=__doc__ or "",
    targets=(
        Target(
            CONFIG,
            "VllmConfig.__post_init__",
            _caching_off,
            POST_INIT,
        ),
    ),
)
