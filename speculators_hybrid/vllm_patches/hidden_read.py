"""The hidden-state group's own slots for reads (vLLM 0.24.x) and padding (vLLM 0.22-0.24).

Why (`hidden-states-read-slots`, vLLM 0.24.x): vLLM 0.24's `ExampleHiddenStatesConnector`
rebuilds a finished request's read slots from its block ids with `cache_config.block_size`,
the engine's, while the cache view it reads is laid out in the hidden-state group's own,
smaller block (a page holds fewer hidden-state tokens than attention tokens). The two differ
on hybrid targets whenever the worker's config does not hold the hidden group's block: with
tensor parallelism (workers keep the block size from before planning) and always with
`hidden-block-divides-engine-block` (the engine keeps the model's block). The rows are then
read from other blocks: zeros where those are free, other requests' hidden states where not,
and no error (speculators issue 613). Shown on the CPU with vLLM 0.24.0's own scheduler,
connector and cache views (tests/cpu/test_hidden_read.py): every row of the file is zero.
0.22.x-0.23.x read with the forward pass's per-layer slot mapping and are not affected.
How: once the worker has registered its caches, the connector's block size is the hidden
group's, checked against the block size of the view it indexes.
Upstream: PR 46301 (vLLM 0.25.0) takes the block size from the group's spec.

Why (`hidden-states-pad-slots`, vLLM 0.22.x-0.24.x): CUDA-graph padding tokens carry slot -1,
which the store turns into the last slot of the cache's last block: a real block that another
request (any group: the memory is shared with a layer of every group) may own.
How: padding goes to slot 0 of vLLM's null block 0, as on vLLM < 0.22 (`hidden_write.store`).
Upstream: vLLM 0.25.0 clamps padding slots to the null block.
"""

from __future__ import annotations

from typing import Any

from speculators_hybrid.registry import Patch, Target
from speculators_hybrid.vllm_patches._targets import STOCK_CONNECTOR as CONNECTOR
from speculators_hybrid.vllm_patches.hidden_write import store_with_null_padding

MODELS = "vllm.model_executor.models.extract_hidden_states"


def group_block_size(kv_cache_config: Any, layer: str) -> int | None:
    """Block size of the KV-cache group that holds `layer`, or None without a config."""
    if kv_cache_config is None:
        return None
    for group in kv_cache_config.kv_cache_groups:
        if layer in group.layer_names:
            return int(group.kv_cache_spec.block_size)
    return None


def _read_with_group_block(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    result = wrapped(*args, **kwargs)
    view_block = instance._kv_cache.shape[1]  # [blocks, block_size, ids, hidden]
    block = group_block_size(instance._kv_cache_config, instance.cache_layers[0]) or view_block
    if block != view_block:
        raise ValueError(
            f"speculators-hybrid: the hidden-state group's block size is {block} but its cache "
            f"view holds {view_block} tokens per block; refusing to read wrong slots"
        )
    instance._block_size = block
    return result


PATCH = Patch(
    id="hidden-states-read-slots",
    project="vllm",
    versions=">=0.24,<0.25",
    fixed_upstream="vLLM PR 46301, released in 0.25.0",
    why=__doc__ or "",
    targets=(
        Target(
            CONNECTOR,
            "ExampleHiddenStatesConnector.register_kv_caches",
            _read_with_group_block,
            ("95c8f0ae4bf1cf7e",),  # 0.24.0
        ),
    ),
)

PAD_PATCH = Patch(
    id="hidden-states-pad-slots",
    project="vllm",
    versions=">=0.22,<0.25",
    fixed_upstream="vLLM 0.25.0 (padding slots clamped to the null block)",
    why=__doc__ or "",
    # The same code in 0.22.0-0.24.0.
    targets=(Target(MODELS, "basic_cache", store_with_null_padding, ("e30f09c5488f3249",)),),
)
