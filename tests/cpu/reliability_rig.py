"""Our connector (vLLM < 0.22; 0.22-0.23 with chunked prefill), both sides, for the reliability
tests: vLLM's real scheduler
makes the scheduler-side connector; the worker-side connector writes real files from a cache.

Nothing of vLLM is replaced: the config, the plan, the scheduler, its KV cache manager and
its request objects are vLLM's; the model's forward is what tests stand in for (a cache
filled with known values).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from conftest import engine_config, engine_scheduler, model_output

from speculators_hybrid import planning
from speculators_hybrid.vllm_patches.connector import (
    HybridHiddenStatesConnector,
    hidden_group_index,
)

IDS = (2, 5, 8)
HIDDEN = 256  # the tiny preset's hidden size


@dataclass
class Rig:
    config: Any
    kv: Any
    scheduler: Any
    request: Any
    worker: HybridHiddenStatesConnector
    layer: str
    cache: torch.Tensor
    block: int
    gid: int

    def finish(self, out: Any, sampled: dict[str, int]) -> dict[str, Any]:
        """The worker's part of the step `out`, then the scheduler's: request id -> its
        finished output's kv_transfer_params."""
        self.worker.bind_connector_metadata(out.kv_connector_metadata)
        self.worker.save_kv_layer(self.layer, self.cache, None)
        self.worker.clear_connector_metadata()
        results = self.scheduler.update_from_output(out, model_output(out, sampled))
        return {
            o.request_id: o.kv_transfer_params
            for eco in results.values()
            for o in eco.outputs
            if o.finished
        }

    def run(self, req_id: str, prompt: list[int]) -> dict[str, Any]:
        """One prompt to completion (one step when it fits a chunk): its kv_transfer_params."""
        self.scheduler.add_request(self.request(req_id, prompt))
        for _ in range(20):
            out = self.scheduler.schedule()
            done = {
                r
                for r in out.num_scheduled_tokens
                if self.scheduler.requests[r].num_computed_tokens
                >= self.scheduler.requests[r].num_prompt_tokens
            }
            finished = self.finish(out, {r: 7 for r in done})
            if req_id in finished:
                return finished[req_id]
        raise AssertionError(f"{req_id!r} did not finish")

    def drain(self) -> None:
        if self.worker._writer is not None:
            self.worker._writer.drain()

    def expected(self, block_ids: list[int], n: int) -> torch.Tensor:
        from speculators_hybrid.vllm_patches.connector import slots_for

        slots = slots_for(block_ids, self.block, n)
        return self.cache[slots // self.block, slots % self.block]


def chunked(config: Any, chunk: int) -> None:
    """Prefill chunks of `chunk` tokens (vLLM >= 0.31 also reads max_num_scheduled_tokens)."""
    config.scheduler_config.max_num_batched_tokens = chunk
    if getattr(config.scheduler_config, "max_num_scheduled_tokens", None) is not None:
        config.scheduler_config.max_num_scheduled_tokens = chunk


def rig(storage: str, memory: int = 64 << 20, chunk: int | None = None, **extra: Any) -> Rig:
    """Scheduler and worker of our connector, storage folder `storage`, a KV pool of `memory`."""
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    config = engine_config(
        preset="tiny", ids=IDS, prefix_caching=False, max_model_len=4096, chunked_prefill=None
    )
    config.kv_transfer_config.kv_connector_extra_config.update(shared_storage_path=storage, **extra)
    if chunk is not None:
        chunked(config, chunk)
    kv = planning.plan(config, planning.layer_specs(config), memory)
    scheduler, request = engine_scheduler(config, kv)
    assert isinstance(scheduler.connector, HybridHiddenStatesConnector)
    gid = hidden_group_index(kv)
    block = kv.kv_cache_groups[gid].kv_cache_spec.block_size
    layer, _ = planning.hidden_state_layer(config)
    worker = HybridHiddenStatesConnector(config, KVConnectorRole.WORKER)
    cache = torch.randn(kv.num_blocks, block, len(IDS), HIDDEN).to(torch.bfloat16)
    worker.register_kv_caches({layer: cache})
    return Rig(config, kv, scheduler, request, worker, layer, cache, block, gid)
