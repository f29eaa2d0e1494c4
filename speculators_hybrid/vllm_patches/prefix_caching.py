"""Prefix caching off for hybrid hidden-state extraction (vLLM >= 0.22, except 0.25.0).

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
Opt-in (issue 17): SPECULATORS_HYBRID_PREFIX_CACHING=1 (`launch` sets it when the user passes
--enable-prefix-caching) keeps prefix caching on, with a warning. Proven so far on the CPU: a
hit resumes where the GDN layers saved state (tests/cpu/test_prefix_hit.py with prefix_hit.py
on 0.24-0.28, test_prefix_hit_fixed.py stock from 0.27); and the file written after a hit holds
every prompt token, each row read from the slot its token's row was written to, equal to an
uncached run's file (tests/cpu/test_prefix_hit_file.py: vLLM's scheduler, prefix cache and both
connector sides with the opt-in, shared prefixes below a block, block multiples, across step
ends, whole-prompt repeats; 0.22.1, 0.23.0 with our connector, which hidden-states-chunked-
prompts names there since vLLM's refuses the chunked prefill that Mamba 'align' mode needs;
0.24.0-0.33.0 with vLLM's). vLLM issue 44485 (a file of only the newly computed tokens) is the
0.22-0.23 connector's read in the forward pass, which a hybrid model with a hit never reaches;
from 0.24 vLLM's reads the whole block table and it does not reproduce. Not yet proven: any GPU
run but 0.25.0's; the CPU test's model is a stand-in, so it cannot see the attention or GDN
state a hit resumes from (0.32+ hit on the hidden group's 20-token hash block, inside an
attention block). With --no-enable-chunked-prefill on 0.22-0.23 the opt-in is refused (vLLM's
connector stays). The range narrows release by release as those proofs hold.
The opt-in does not keep it for a model vLLM caches in 'all' Mamba cache mode on 0.22-0.31
(Nemotron-H, Granite 4.0-H, ...): the engine core stops there (mamba_all_mode.py).
Retired on 0.25.0 (for the models mamba_all_mode.py leaves cached): on an H200 (2026-12-02,
tests/gpu/test_hidden_states_match.py, prefix caching on, with
hidden-states-consistent-prefix-hit) the 4 prompts of the second round hit
800, 480, 1,440 and 80 tokens of the first's (the 1,200-token shared prefix of the failure
above among them) and all 8 files matched transformers within verify's calibrated floor (worst
similarity 0.99969 at id 8, floor 0.99965).
Upstream: none yet.
"""

from __future__ import annotations

import logging
from typing import Any

from packaging.version import Version

from speculators_hybrid import switches
from speculators_hybrid.registry import Patch, Target, base_version
from speculators_hybrid.vllm_patches.hma_config import (
    CONNECTOR,
    POST_INIT_FINGERPRINTS,
    is_hybrid_extraction,
)
from speculators_hybrid.vllm_patches.mamba_all_mode import all_mode, stops_engine_here, turn_off

logger = logging.getLogger("vllm.speculators_hybrid")
OPT_IN_ENV = "SPECULATORS_HYBRID_PREFIX_CACHING"
FIRST_OPT_IN = Version("0.22")
# vLLM PR 37374 made ExampleHiddenStatesConnector refuse chunked prefill; PR 43805 lifted it.
STOCK_REFUSES_CHUNKED = (Version("0.22.0"), Version("0.24.0"))
STOCK_TAKES_CHUNKS = STOCK_REFUSES_CHUNKED[1]  # before it, only our connector (chunked_prompts.py)


def opted_in() -> bool:
    return switches.on(OPT_IN_ENV)


def opt_in_allowed(version: str | None) -> bool:
    return version is not None and Version(str(base_version(version))) >= FIRST_OPT_IN


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
    if cache is not None and cache.enable_prefix_caching and is_hybrid_extraction(instance):
        import vllm

        if all_mode(instance) and stops_engine_here(vllm.__version__):
            turn_off(instance)  # mamba_all_mode.py: the engine core would stop on a 1-token chunk
            return wrapped(*args, **kwargs)
        if opted_in() and opt_in_allowed(vllm.__version__) and _takes_chunks(instance):
            logger.warning(
                "speculators-hybrid: prefix caching kept on for hidden-state extraction from a "
                "hybrid model, as %s asks: on vLLM %s files after a cache hit are not yet proven "
                "right on a GPU; check them with `speculators-hybrid verify`",
                OPT_IN_ENV,
                vllm.__version__,
            )
            return wrapped(*args, **kwargs)
        if opted_in():
            logger.warning(
                "speculators-hybrid: %s is ignored on vLLM %s: its stock connector refuses "
                "chunked prefill, which prefix caching of a hybrid model needs",
                OPT_IN_ENV,
                vllm.__version__,
            )
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
    versions=">=0.22,!=0.25.0",
    fixed_upstream="none yet",
    why=__doc__ or "",
    targets=(
        Target(
            "vllm.config.vllm",
            "VllmConfig.__post_init__",
            _caching_off,
            POST_INIT_FINGERPRINTS,
        ),
    ),
)
