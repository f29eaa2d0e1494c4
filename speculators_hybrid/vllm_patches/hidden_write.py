"""Write hidden states into the hidden-state group's own slots (vLLM < 0.22).

Why: the proposer writes with the slot mapping of KV-cache group 0 (the first attention
group), computed with that group's block size, so with a group of its own the hidden states
would land in the wrong blocks. Padding tokens carry slot -1, which Python indexing turns
into the last slot of the cache: a real block. And the store flattens the cache as if it
were contiguous, which a page-padded cache is not.
How: the proposer takes the extraction layer's own slot mapping (the model runner already
builds one per layer); the store indexes (block, offset) on the strided view and sends
padding tokens to slot 0 of block 0, vLLM's null block, which no request owns.
Upstream: PR 39949 (vLLM 0.22.0).
"""

from __future__ import annotations

import copy
from typing import Any

from speculators_hybrid.registry import Patch, Target

MODELS = "vllm.model_executor.models.extract_hidden_states"
PROPOSER = "vllm.v1.spec_decode.extract_hidden_states"


def block_index(kv_cache: Any, slots: Any) -> tuple[Any, Any]:
    """(block, offset) of each slot in a [blocks, block_size, ids, hidden] view, padded or not:
    per-block indexing works on the strided view of a page-padded cache; flattening does not."""
    block_size = kv_cache.shape[1]
    return slots // block_size, slots % block_size


def store(to_cache: Any, kv_cache: Any, slot_mapping: Any) -> None:
    """kv_cache[slot] = to_cache; padding slots (-1) go to slot 0 of the null block 0."""
    import torch

    slots = torch.where(slot_mapping >= 0, slot_mapping, torch.zeros_like(slot_mapping))
    kv_cache[block_index(kv_cache, slots)] = to_cache


def store_with_null_padding(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> None:
    """In place of vLLM's `basic_cache` (here and in hidden_read.py's pad patch)."""
    store(*args, **kwargs)


def _own_slots(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    per_layer = kwargs.get("slot_mappings")
    common = kwargs.get("common_attn_metadata")
    names = instance.attn_layer_names
    if isinstance(per_layer, dict) and common is not None and names and names[0] in per_layer:
        common = copy.copy(common)
        common.slot_mapping = per_layer[names[0]][: common.slot_mapping.shape[0]]
        kwargs = {**kwargs, "common_attn_metadata": common}
    return wrapped(*args, **kwargs)


PATCH = Patch(
    id="hidden-states-write-slots",
    project="vllm",
    versions=">=0.20,<0.22",
    fixed_upstream="vLLM PR 39949, released in 0.22.0",
    why=__doc__ or "",
    # Fingerprints: the same code in 0.20.0-0.20.2 and 0.21.0.
    targets=(
        Target(MODELS, "basic_cache", store_with_null_padding, ("f358f62a5526500c",)),
        Target(PROPOSER, "ExtractHiddenStatesProposer.propose", _own_slots, ("8fd89e7ab4df0b60",)),
    ),
)
