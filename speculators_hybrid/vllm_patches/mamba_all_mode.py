"""Prefix caching off for hidden-state extraction where vLLM caches Mamba state per block.

Why: with prefix caching on, vLLM keeps the Mamba state of a model whose class supports Mamba
prefix caching (Nemotron-H, Granite 4.0-H, Falcon-H1, Zamba2, Jamba, Mamba, Mamba2) at every
block: Mamba cache mode 'all' (GDN and short-conv models use 'align'). Extraction runs as
speculative decoding with one speculative token, and vLLM 0.22-0.31's MambaMixer2 then takes
its speculative path for every 1-token query, which needs the previous step's block index; the
model runner passes that index only in a step with draft tokens, and extraction schedules none.
So the first prompt whose last prefill chunk is one token stops the engine core
(`assert block_idx_last_scheduled_token_prev_step_d is not None` in mamba_mixer2.py), with
every request in flight lost. Seen on a GPU (vLLM 0.25.0, tests/gpu/test_hybrid_families.py,
prefix caching on; tests/gpu/results/): Nemotron-H and Zamba2 died on a 513-token
prompt chunked 512 + 1; Granite 4.0-H and Falcon-H1 matched transformers after their hits only
because their block sizes gave no 1-token chunk; Jamba (Mamba1) never hit (its tiny model's
block is 2,048 tokens), so its files after a hit are unproven.
How: before vLLM builds its config, hybrid extraction with prefix caching on, for a model
vLLM would cache in 'all' mode (`model_config.supports_mamba_prefix_caching`, Mamba cache mode
unset or 'all'), gets `enable_prefix_caching=False`, with a log line saying why. An explicit
`--mamba-cache-mode align` keeps caching on (not GPU-proven for Mamba2). On vLLM 0.22-0.31 (the
assertion's releases); from 0.28 vLLM's default is 'align' for every model, so there only an
explicit `--mamba-cache-mode all` is turned off. On 0.20.1 Nemotron-H with prefix caching on
matched transformers after its hits on a GPU (tests/gpu/results/).
Upstream: none yet (vLLM 0.32.0 rewrote that path: no such assertion there).
"""

from __future__ import annotations

import logging
from typing import Any

from packaging.specifiers import SpecifierSet

from speculators_hybrid import families
from speculators_hybrid.registry import Patch, Target, base_version
from speculators_hybrid.vllm_patches._targets import CONFIG, POST_INIT, is_hybrid_extraction

logger = logging.getLogger("vllm.speculators_hybrid")
# the releases whose MambaMixer2 asserts on a 1-token query without draft tokens
CRASHES = ">=0.22,<0.32"
# where vLLM, with prefix caching and no --mamba-cache-mode, picks 'all' for a class that
# supports Mamba prefix caching (from 0.28 it picks 'align' for every model)
ALL_BY_DEFAULT = "<0.28"


def caches_all(mode: str | None, vllm: str | None) -> bool:
    """vLLM caches in 'all' mode: asked for, or left to its default (unset or 'none')."""
    by_default = vllm is not None and base_version(vllm) in SpecifierSet(ALL_BY_DEFAULT)
    return mode == "all" or (mode in (None, "none") and by_default)


def stops_engine_here(vllm: str | None) -> bool:
    """This vLLM's MambaMixer2 stops the engine core on a 1-token chunk in 'all' mode."""
    return vllm is not None and base_version(vllm) in SpecifierSet(CRASHES)


def stops_engine(model_type: str | None, vllm: str | None) -> bool:
    """Prefix caching would stop the engine core for this model type on this vLLM (`launch`
    reads families.py; the engine asks vLLM's model_config)."""
    family = families.BY_TYPE.get(model_type or "")
    return family is not None and family.mamba_all_mode and stops_engine_here(vllm)


def all_mode(config: Any) -> bool:
    """Hybrid extraction with prefix caching on, for a model vLLM caches in 'all' mode (asked
    for, or vLLM's default for it on this release)."""
    import vllm

    cache = getattr(config, "cache_config", None)
    model = getattr(config, "model_config", None)
    mode = getattr(cache, "mamba_cache_mode", "none")
    return (
        cache is not None
        and bool(cache.enable_prefix_caching)
        and is_hybrid_extraction(config)
        and caches_all(mode, vllm.__version__)
        and bool(getattr(model, "supports_mamba_prefix_caching", False))
    )


def turn_off(config: Any) -> None:
    config.cache_config.enable_prefix_caching = False
    logger.warning(
        "speculators-hybrid: prefix caching turned off for hidden-state extraction from %s: "
        "vLLM would cache its Mamba state per block ('all' mode), where extraction stops the "
        "engine core on a 1-token prefill chunk (speculators_hybrid/vllm_patches/"
        "mamba_all_mode.py); --mamba-cache-mode align keeps caching on",
        config.model_config.architecture,
    )


def _caching_off(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    if all_mode(instance):
        turn_off(instance)
    return wrapped(*args, **kwargs)


PATCH = Patch(
    id="no-prefix-caching-for-mamba-all-mode",
    project="vllm",
    versions=CRASHES,
    fixed_upstream="none yet",
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
