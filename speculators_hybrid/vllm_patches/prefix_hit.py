"""A prefix-cache hit lands where every group, Mamba/GDN included, has state (vLLM 0.24-0.26).

Why: with any KV connector on a hybrid model, vLLM 0.24/0.25's scheduler takes the local hit
from `find_longest_cache_hit_per_group` and uses the deepest group's hit (`max`), expecting the
connector to bring the Mamba state for that boundary (as NIXL's P/D transfer does). The
hidden-states connector stores only. So a prompt sharing 1,200 tokens with an earlier one
prefilled in 400/400/480-token steps resumed at token 1,200, where the GDN layers had saved no
state (they had at 800): the new tokens ran from a wrong state. This is the root cause of the
wrong hidden states seen on a GPU with vLLM 0.25.0 after a prefix-cache hit (docs/verify.md;
hits ending on a step boundary were right). vLLM issue 46453.
How: while extracting (the plan has a hidden-state group), the per-group lookup answers with
the hit all groups agree on (`find_longest_cache_hit`, the path used without a connector):
every group resumes at that length.
0.26 is the same path (its `find_longest_cache_hit` also returns an uncached shared prefix, which
the per-group path drops anyway).
Upstream: vLLM 0.27.0 falls back to the hit all groups agree on when no connector tokens back a
deeper per-group hit; 0.28.0 takes per-group hits only from connectors that declare
`supports_divergent_local_hybrid_hits` (issue 46453; PRs 48425, 50344). Both resume at 960 here
(tests/cpu/test_prefix_hit_fixed.py).
With this fix GPU runs of vLLM 0.24.0 and 0.25.0 matched transformers after their hits
(tests/gpu/results/), so prefix caching stays on for hybrid extraction (prefix_caching.py
turns it off only where vLLM's own connector cannot take chunked prefill, 0.22-0.23).
"""

from __future__ import annotations

from typing import Any

from speculators_hybrid.registry import Patch, Target, argument
from speculators_hybrid.vllm_patches._targets import is_hidden


def _agreed_hit(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    groups = instance.kv_cache_config.kv_cache_groups
    if not any(is_hidden(g.kv_cache_spec) for g in groups):
        return wrapped(*args, **kwargs)  # not extraction: a connector that may transfer state
    block_hashes = argument(args, kwargs, 0, "block_hashes")
    max_length = argument(args, kwargs, 1, "max_cache_hit_length")
    # 0.26 returns a third value, the uncached shared prefix: dropped, as the per-group path does
    blocks, hit, *_ = instance.find_longest_cache_hit(block_hashes, max_length)
    return blocks, (hit,) * len(groups)


PATCH = Patch(
    id="hidden-states-consistent-prefix-hit",
    project="vllm",
    versions=">=0.24,<0.27",
    fixed_upstream="vLLM 0.27.0 (a per-group hit no connector backs is reconciled; issue 46453)",
    why=__doc__ or "",
    targets=(
        Target(
            "vllm.v1.core.kv_cache_coordinator",
            "HybridKVCacheCoordinator.find_longest_cache_hit_per_group",
            _agreed_hit,
            ("756f9156f416aa7b", "2b8e8dddbe10418d"),  # 0.24.0-0.25.1, 0.26.0
        ),
    ),
)
