"""vLLM's own hidden-states connector (vLLM >= 0.22), both sides, driven through one prompt.

Real: the config, the KV-cache plan, the scheduler and the scheduler-side connector it makes,
the worker-side connector (vLLM's factory, through `ensure_kv_transfer_initialized`, in a
one-process gloo tensor-parallel group), the store (`basic_cache`), the connector's read and
write, and the reader (`load_hidden_states`). Stand-ins, only inside the connector module:
CUDA streams, events and pinned memory, which the connector uses to copy off the GPU.
"""

from __future__ import annotations

import contextlib
import os
import socket
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from conftest import PATCHED_VLLM, PATCHER, VLLM, engine_scheduler, model_output, vllm_patches

from speculators_hybrid.vllm_patches.connector import slots_for

CONNECTOR = "vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector"
# 0.22-0.23 read during the forward pass; 0.24+ a step after the request finished.
READS_IN_FORWARD = VLLM.release < (0, 24)
# The hidden cache view: [blocks, block, ids, hidden] (V1 runner), [blocks, ids, block, hidden]
# from 0.29 (`basic_cache` and the connector's read index it so).
BLOCK_DIM = 2 if VLLM.release >= (0, 29) else 1


class _Event:
    def record(self, stream: Any = None) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True


class _Stream:
    def wait_event(self, event: Any) -> None:
        return None


class _Cuda:
    Event = _Event
    Stream = _Stream

    @staticmethod
    def stream(stream: Any) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()


class CpuTorch:
    """torch, with CPU stand-ins for the CUDA copy machinery (the host is the device here)."""

    cuda = _Cuda()

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    @staticmethod
    def empty_like(tensor: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        kwargs.pop("pin_memory", None)
        return torch.empty_like(tensor, **kwargs)


@pytest.fixture
def cpu_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stand-ins where vLLM's connector and our copy-when-ready patch reach CUDA."""
    import importlib

    from speculators_hybrid.vllm_patches import copy_ready

    monkeypatch.setattr(importlib.import_module(CONNECTOR), "torch", CpuTorch())
    monkeypatch.setattr(copy_ready, "_cuda", lambda: CpuTorch.cuda)


@contextlib.contextmanager
def without(*patch_ids: str):
    """Every patch this vLLM needs but `patch_ids` (the plugin as it was without them)."""
    if PATCHED_VLLM:
        pytest.skip(f"vLLM's source carries {patch_ids}: there is no vLLM without them")
    PATCHER.revert()
    PATCHER.apply([p for p in vllm_patches() if p.id not in patch_ids])
    try:
        yield
    finally:
        PATCHER.revert()
        PATCHER.apply(vllm_patches())


def _backend(spec: Any, name: str, layers: dict[str, Any]) -> Any:
    """The attention backend of a group: its layer's own if the config registered the layer
    (vLLM >= 0.22 tests), else by spec: the extraction layer's, GDN, or FlashAttention."""
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend
    from vllm.v1.attention.backends.gdn_attn import GDNAttentionBackend
    from vllm.v1.kv_cache_interface import MambaSpec

    from speculators_hybrid.vllm_patches.spec import HiddenStatesCacheSpec

    if name in layers:
        return layers[name].get_attn_backend()
    if isinstance(spec, HiddenStatesCacheSpec):  # our spec, vLLM < 0.22
        from vllm.model_executor.models.extract_hidden_states import CacheOnlyAttentionBackend

        return CacheOnlyAttentionBackend
    return GDNAttentionBackend if isinstance(spec, MambaSpec) else FlashAttentionBackend


def runner_views(config: Any, kv: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Raw tensors and per-layer views, allocated and reshaped by the V1 model runner's own
    methods (vLLM < 0.29; a runner object given only the attributes those methods read): the
    hidden layer shares its memory with the other groups' layers as on the GPU."""
    from vllm.config import set_current_vllm_config
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    from vllm.v1.worker.utils import AttentionGroup

    layers = config.compilation_config.static_forward_context
    runner = GPUModelRunner.__new__(GPUModelRunner)
    runner.device = torch.device("cpu")
    runner.kv_cache_config = kv
    runner.cache_config = config.cache_config
    runner.runner_only_attn_layers = set()
    runner.attn_groups = []
    for gid, group in enumerate(kv.kv_cache_groups):
        spec = group.kv_cache_spec
        backend = _backend(spec, group.layer_names[0], layers)
        runner.attn_groups.append([AttentionGroup(backend, group.layer_names, spec, gid)])
    raw = runner._allocate_kv_cache_tensors(kv)
    with set_current_vllm_config(config):
        sizes = [g.kv_cache_spec.block_size for g in kv.kv_cache_groups]
        return raw, runner._reshape_kv_cache_tensors(raw, sizes)


def tp_world(config: Any) -> None:
    """A one-process tensor-parallel group (gloo), as a TP=1 worker has."""
    from vllm.config import set_current_vllm_config
    from vllm.distributed import parallel_state as ps

    if ps.model_parallel_is_initialized():
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with set_current_vllm_config(config):
        ps.init_distributed_environment(
            world_size=1,
            rank=0,
            distributed_init_method=f"tcp://127.0.0.1:{port}",
            local_rank=0,
            backend="gloo",
        )
        ps.ensure_model_parallel_initialized(1, 1)


def hidden_group(kv: Any) -> tuple[int, Any]:
    from vllm.v1.kv_cache_interface import HiddenStateCacheSpec

    (gid,) = [
        i
        for i, g in enumerate(kv.kv_cache_groups)
        if isinstance(g.kv_cache_spec, HiddenStateCacheSpec)
    ]
    return gid, kv.kv_cache_groups[gid]


def plain_view(kv: Any) -> torch.Tensor:
    """The hidden layer's cache as one contiguous tensor in this version's view layout."""
    spec = hidden_group(kv)[1].kv_cache_spec
    shape = [kv.num_blocks, spec.num_kv_heads, spec.head_size]
    shape.insert(BLOCK_DIM, spec.block_size)
    return torch.zeros(shape, dtype=spec.dtype)


@dataclass
class Extraction:
    config: Any
    kv: Any
    scheduler: Any
    request: Any
    worker: Any  # vLLM's worker-side ExampleHiddenStatesConnector
    layer: str
    block: int  # the hidden-state group's block size
    gid: int
    view: torch.Tensor


@contextlib.contextmanager
def extraction(config: Any, kv: Any, view: torch.Tensor | None = None):
    """Scheduler and worker for `config`'s plan `kv`, the worker's cache registered."""
    from vllm.distributed.kv_transfer import kv_transfer_state as state

    scheduler, request = engine_scheduler(config, kv)
    tp_world(config)
    state.ensure_kv_transfer_initialized(config, kv)
    worker = state.get_kv_transfer_group()
    try:
        gid, group = hidden_group(kv)
        layer = group.layer_names[0]
        view = plain_view(kv) if view is None else view
        worker.register_kv_caches({layer: view})
        yield Extraction(
            config, kv, scheduler, request, worker, layer, group.kv_cache_spec.block_size, gid, view
        )
    finally:
        state.ensure_kv_transfer_shutdown()


def extract(ex: Extraction, req_id: str, states: torch.Tensor) -> dict[str, Any]:
    """One prompt of `len(states)` tokens through scheduler, store and connector.

    Returns the request's `kv_transfer_params`. The file's writer runs in the connector's
    thread pool; `load_hidden_states` waits for it on the lock, as clients do.
    """
    from vllm.model_executor.models.extract_hidden_states import basic_cache

    worker = ex.worker
    ex.scheduler.add_request(ex.request(req_id, list(range(1, len(states) + 1))))
    out = ex.scheduler.schedule()
    (new,) = out.scheduled_new_reqs
    slots = slots_for(list(new.block_ids[ex.gid]), ex.block, len(states))
    basic_cache(states.to(ex.view.dtype), ex.view, slots)  # the proposer's store, its group's slots
    worker.bind_connector_metadata(out.kv_connector_metadata)
    if READS_IN_FORWARD:
        _save_in_forward(ex, slots)
    worker.wait_for_save()
    worker.clear_connector_metadata()
    outputs = ex.scheduler.update_from_output(out, model_output(out, {req_id: 7}))
    (finished,) = [o for eco in outputs.values() for o in eco.outputs if o.request_id == req_id]
    nxt = ex.scheduler.schedule()  # 0.24+: the finished request's save travels in this step
    worker.bind_connector_metadata(nxt.kv_connector_metadata)
    worker.get_finished(set())
    worker.clear_connector_metadata()
    return finished.kv_transfer_params


def _save_in_forward(ex: Extraction, slots: torch.Tensor) -> None:
    from vllm.forward_context import set_forward_context
    from vllm.model_executor.models.extract_hidden_states import CacheOnlyAttentionMetadata

    with set_forward_context(None, ex.config, slot_mapping={ex.layer: slots}):
        ex.worker.save_kv_layer(ex.layer, ex.view, CacheOnlyAttentionMetadata(slots))


def load(path: str) -> dict[str, torch.Tensor]:
    """vLLM's own reader: waits on `<path>.lock` for the writer, then loads (no metadata)."""
    import importlib

    return importlib.import_module(CONNECTOR).load_hidden_states(path)


def storage(config: Any, path: os.PathLike, **extra: Any) -> None:
    config.kv_transfer_config.kv_connector_extra_config.update(
        shared_storage_path=str(path), **extra
    )
