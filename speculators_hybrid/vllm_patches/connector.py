"""A hidden-states connector for hybrid models, loaded by vLLM through `kv_connector_module_path`.

Same contract as vLLM's `ExampleHiddenStatesConnector`: one safetensors file per request at
`{shared_storage_path}/{req_id}.safetensors` holding `hidden_states` [tokens, ids, hidden]
and `token_ids` (int64, the prompt), its path returned as
`kv_transfer_params["hidden_states_path"]`. Differences: it supports several KV-cache groups
(`SupportsHMA`) and reads the hidden-state group's blocks with that group's block size (from
the W caches of that group with `hidden-states-wide-group`, joined along the hidden dim); it
writes each file once, when the whole prompt has been computed (so a prompt longer than one
prefill chunk still gives one complete file); one tensor-parallel rank writes; the file
appears atomically (written aside, then renamed) while an exclusive `flock` is held on
`<path>.lock`, which is left for the reader to remove. Opt-in guard
(`kv_connector_extra_config["refuse_bad_hidden_states"]` or `SPECULATORS_HYBRID_REFUSE_BAD=1`):
a file with NaN/Inf or all-zero token rows is not written; the request's
`kv_transfer_params` then carry no path and a `hidden_states_error` saying why.
Files are written from writer threads, the lock taken before the step ends (writer.py), unless
`async_writes` is false or the guard is on: then inside the step.
"""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
)

from speculators_hybrid.vllm_patches.file_names import hidden_states_path, sweep
from speculators_hybrid.vllm_patches.fp8_files import encode, file_format
from speculators_hybrid.vllm_patches.hidden_write import block_index
from speculators_hybrid.vllm_patches.provenance_meta import (
    bad_rows,
    guard_enabled,
    provenance,
    refuse,
    save_whole,
)
from speculators_hybrid.vllm_patches.writer import (
    FileWriter,
    async_enabled,
    clear_failure,
    report_failure,
    take_failure,
    writer_threads,
)

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request


def slots_for(block_ids: list[int], block_size: int, num_tokens: int) -> torch.Tensor:
    """Cache slot of each of the first `num_tokens` tokens, given a request's block ids."""
    positions = torch.arange(num_tokens, dtype=torch.int64)
    blocks = torch.tensor(block_ids, dtype=torch.int64)[positions // block_size]
    return blocks * block_size + positions % block_size


def whole_blocks(slots: torch.Tensor, block_size: int) -> torch.Tensor | None:
    """The blocks holding `slots`, in order, when the slots fill them from their first slot on
    (a request's tokens, as `slots_for` maps them); None for any other slots."""
    n = slots.numel()
    if n == 0 or slots.is_cuda:
        return None
    blocks = slots[::block_size] // block_size
    offsets = torch.arange(n, dtype=slots.dtype) % block_size
    if not torch.equal(blocks.repeat_interleave(block_size)[:n] * block_size + offsets, slots):
        return None
    return blocks


def _to_device(index: torch.Tensor, device: torch.device) -> torch.Tensor:
    """From pinned memory without blocking: a plain `.to(device)` of a CPU tensor waits for
    everything the stream has queued (the whole forward so far), which stalls the host inside
    the step and undoes vLLM's overlap of step N+1's scheduling with step N."""
    if device.type == "cpu" or index.is_cuda:
        return index
    return index.pin_memory().to(device, non_blocking=True)


def read_slots(kv_cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Rows of a [blocks, block_size, ids, hidden] cache view (page-padded or not).

    A request's slots fill whole blocks in order, so its rows are read a block at a time (one
    contiguous copy per block); other slots, a row at a time.
    """
    return read_wide([kv_cache], slots)


def read_wide(kv_caches: list[torch.Tensor], slots: torch.Tensor) -> torch.Tensor:
    """The same rows of each of the W caches of `hidden-states-wide-group` (cache j holds
    hidden columns j*h/W:(j+1)*h/W), joined along the last dim: [tokens, ids, h]."""
    first, n = kv_caches[0], slots.numel()
    blocks = whole_blocks(slots, first.shape[1])  # every slice has the same blocks and size
    if blocks is not None:
        index = _to_device(blocks, first.device)
        parts = [c.index_select(0, index).flatten(0, 1)[:n] for c in kv_caches]
    else:
        rows = block_index(first, _to_device(slots, first.device))
        parts = [c[rows] for c in kv_caches]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)


def write_file(
    path: str, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None
) -> None:
    """Write `path` so that no reader sees it incomplete; hold `<path>.lock` meanwhile.

    The lock file is left in place, as vLLM's own writer leaves it: speculators' readers
    take the lock, read, then delete it themselves.
    """
    with open(f"{path}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        save_whole(path, tensors, metadata)


@dataclass
class SaveRequest:
    req_id: str
    path: str
    token_ids: list[int]
    slots: torch.Tensor


@dataclass
class HiddenStatesMetadata(KVConnectorMetadata):
    saves: list[SaveRequest] = field(default_factory=list)


@dataclass
class _Prompt:
    path: str
    token_ids: list[int]
    block_ids: list[int]
    saved: bool = False


def hidden_group_index(kv_cache_config: KVCacheConfig | None) -> int:
    """Index of the KV-cache group that holds the extraction layer's cache."""
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    if kv_cache_config is None:
        raise ValueError("HybridHiddenStatesConnector needs the KV cache config")
    from vllm.v1 import kv_cache_interface

    from speculators_hybrid.vllm_patches.spec import HiddenStatesCacheSpec

    marks = (HiddenStatesCacheSpec, getattr(kv_cache_interface, "HiddenStateCacheSpec", ()))
    groups = kv_cache_config.kv_cache_groups
    for i, group in enumerate(groups):
        if isinstance(group.kv_cache_spec, marks):  # ours (< 0.22) or vLLM's (>= 0.22)
            return i
    # Without our planner patch (non-hybrid target): the only MLA-style group.
    mla = [i for i, g in enumerate(groups) if type(g.kv_cache_spec) is MLAAttentionSpec]
    if len(mla) == 1:
        return mla[0]
    raise ValueError(
        "HybridHiddenStatesConnector: no KV-cache group holds the hidden-state cache; "
        "is the speculators-hybrid vLLM plugin loaded in the engine process?"
    )


class HybridHiddenStatesConnector(KVConnectorBase_V1, SupportsHMA):
    def __init__(
        self,
        vllm_config: VllmConfig,
        role: KVConnectorRole,
        kv_cache_config: KVCacheConfig | None = None,
    ):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        if vllm_config.speculative_config is None:
            raise ValueError(
                "HybridHiddenStatesConnector needs --speculative-config with method "
                "'extract_hidden_states'"
            )
        self._dir = str(
            self._kv_transfer_config.get_from_extra_config("shared_storage_path", "/tmp")
        )
        self._prompts: dict[str, _Prompt] = {}
        self._guard = guard_enabled(self._kv_transfer_config.get_from_extra_config)
        self._format = file_format(self._kv_transfer_config.get_from_extra_config)  # fp8_files
        self._writer: FileWriter | None = None  # None: files written inside the step
        if async_enabled(self._kv_transfer_config.get_from_extra_config) and not self._guard:
            extra = self._kv_transfer_config.get_from_extra_config
            self._writer = FileWriter(writer_threads(extra))
        self._layer: str | None = None
        self._slices: list[torch.Tensor] | None = None  # the W caches (wide group), in order
        self._group = -1
        self._block_size = 0
        if role == KVConnectorRole.WORKER:
            sweep(self._dir)  # parts of files a killed server was writing
        if role == KVConnectorRole.SCHEDULER:
            self._group = hidden_group_index(kv_cache_config)
            spec = kv_cache_config.kv_cache_groups[self._group].kv_cache_spec  # type: ignore[union-attr]
            self._block_size = spec.block_size

    @property
    def prefer_cross_layer_blocks(self) -> bool:
        return False  # the hidden-state cache must stay a layer of its own

    # ---- worker side ----
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        from vllm.config import get_layers_from_vllm_config
        from vllm.model_executor.models.extract_hidden_states import CacheOnlyAttentionLayer

        from speculators_hybrid.vllm_patches.wide_hidden import SLICE

        layers = get_layers_from_vllm_config(
            self._vllm_config, CacheOnlyAttentionLayer, list(kv_caches)
        )
        if len(layers) > 1:  # hidden-states-wide-group: W slices of the hidden dim, in order
            slices = {name: getattr(layer, SLICE, None) for name, layer in layers.items()}
            order = sorted(slices, key=lambda n: slices[n] or (-1, 0))
            if [slices[n] for n in order] != [(j, len(layers)) for j in range(len(layers))]:
                raise ValueError(f"expected one hidden-state cache layer, found {sorted(layers)}")
            self._slices = [kv_caches[name] for name in order]
            self._layer = order[-1]  # the proposer writes the slices in order: read after all
        elif len(layers) == 1:
            self._layer = next(iter(layers))
        else:
            raise ValueError(f"expected one hidden-state cache layer, found {sorted(layers)}")
        self._provenance = provenance(self._vllm_config)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        return None

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def wait_for_save(self) -> None:
        return None

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any
    ) -> None:
        if layer_name != self._layer:
            return
        meta = self._get_connector_metadata()
        assert isinstance(meta, HiddenStatesMetadata)
        if not meta.saves or not _writes_files():
            return
        for save in meta.saves:
            try:
                self._save(save, kv_layer)
            except Exception as exc:  # noqa: BLE001 (one file lost, never the engine)
                # Recorded here for request_finished (same process at TP=1) and in
                # `<path>.rejected` (where the folder still takes a file).
                report_failure(save.path, exc, record=True)

    def _save(self, save: SaveRequest, kv_layer: torch.Tensor) -> None:
        os.makedirs(self._dir, exist_ok=True)  # made again if someone removed it
        clear_failure(save.path)  # a marker left by an earlier request of the same id
        hidden = (
            read_slots(kv_layer, save.slots)
            if self._slices is None
            else read_wide(self._slices, save.slots)
        )
        tokens = torch.tensor(save.token_ids, dtype=torch.int64)
        if self._writer is not None:
            tensors = {"hidden_states": hidden, "token_ids": tokens}
            self._writer.submit(save.path, tensors, self._provenance, self._format)
            return
        hidden = hidden.cpu()
        problem = bad_rows(hidden) if self._guard else None
        if problem is not None:
            refuse(save.path, problem)
            return
        tensors = encode({"hidden_states": hidden, "token_ids": tokens}, self._format)
        write_file(save.path, tensors, self._provenance)

    def shutdown(self) -> None:
        if self._writer is not None:
            self._writer.shutdown()
        super().shutdown()

    # ---- scheduler side ----
    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        return 0, False  # store-only

    def update_state_after_alloc(
        self, request: Request, blocks: Any, num_external_tokens: int
    ) -> None:
        return None

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        meta = HiddenStatesMetadata()
        scheduled = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            prompt = _Prompt(
                path=hidden_states_path(self._dir, new.req_id),  # inside the folder, any id
                token_ids=list(new.prompt_token_ids or []),
                block_ids=list(new.block_ids[self._group]),
            )
            self._prompts[new.req_id] = prompt
            self._save_if_done(
                meta, new.req_id, prompt, new.num_computed_tokens + scheduled[new.req_id]
            )
        cached = scheduler_output.scheduled_cached_reqs
        resumed: set[str] = getattr(cached, "resumed_req_ids", set())
        for i, req_id in enumerate(cached.req_ids):
            known = self._prompts.get(req_id)
            if known is None or known.saved:
                continue
            new_blocks = cached.new_block_ids[i]
            if new_blocks is not None:
                if req_id in resumed:
                    known.block_ids = list(new_blocks[self._group])
                else:
                    known.block_ids.extend(new_blocks[self._group])
            self._save_if_done(
                meta, req_id, known, cached.num_computed_tokens[i] + scheduled[req_id]
            )
        return meta

    def _save_if_done(
        self, meta: HiddenStatesMetadata, req_id: str, prompt: _Prompt, done: int
    ) -> None:
        n = len(prompt.token_ids)
        if prompt.saved or n == 0 or done < n:
            return
        slots = slots_for(prompt.block_ids, self._block_size, n)
        meta.saves.append(SaveRequest(req_id, prompt.path, prompt.token_ids, slots))
        prompt.saved = True

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        prompt = self._prompts.pop(request.request_id, None)
        if prompt is None or not prompt.saved:
            return False, None
        problem = take_failure(prompt.path)
        if problem is not None:
            # No path: the client's request fails, naming why, and nothing reaches training.
            return False, {"hidden_states_path": None, "hidden_states_error": problem}
        return False, {"hidden_states_path": prompt.path}

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        return self.request_finished(request, [])

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: VllmConfig) -> str | None:
        return "NHD"  # one token's hidden states contiguous, as the stock connector asks


def _writes_files() -> bool:
    """Every tensor-parallel rank holds the same hidden states; rank 0 writes them."""
    from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

    try:
        return get_tensor_model_parallel_rank() == 0
    except AssertionError:  # no model-parallel group (single process)
        return True
