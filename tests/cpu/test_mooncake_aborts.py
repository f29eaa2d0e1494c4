"""mooncake-whole-prompts-only against a real Mooncake store on loopback: a request that ends
before its prompt is computed puts nothing; a whole prompt still round-trips to the trainer.

Real: hs-connectors' kv-transfer config from speculators' launcher arguments, vLLM's config,
plan and scheduler (chunked prefill, 512-token chunks) with the scheduler-side connector it
makes, the worker-side connector and its writer thread, the store (master and store process),
the trainer's `MooncakeTransfer`. Stand-ins: the model's forward (rows written to the hidden
cache as vLLM's `basic_cache` writes them) and the connector's device module (`torch.cpu`).
Runs in tox's mooncake env (docs/mooncake.md); elsewhere it skips as test_mooncake_store does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from conftest import needs
from mooncake_store import LOOPBACK
from reliability_rig import chunked
from test_backend_matrix import config_for, prefix_rows
from test_mooncake_store import store, trainer_transfer  # noqa: F401 (store: a fixture)
from upstream_worker import hidden_group, plain_view, tp_world, without

from speculators_hybrid import planning
from speculators_hybrid.vllm_patches.connector import slots_for

PATCH = "mooncake-whole-prompts-only"
CHUNK = 512
LONG = [(i * 37) % 1000 + 1 for i in range(1300)]  # three chunks
WAIT_S = 30.0


@dataclass
class Rig:
    scheduler: Any
    request: Any
    worker: Any
    view: torch.Tensor
    gid: int
    block: int
    tables: dict[str, list[int]] = field(default_factory=dict)
    prompts: dict[str, list[int]] = field(default_factory=dict)
    manifests: dict[str, Any] = field(default_factory=dict)  # the puts handed to the worker

    def add(self, req_id: str, prompt: list[int]) -> None:
        self.prompts[req_id] = prompt
        self.scheduler.add_request(self.request(req_id, prompt))

    def step(self) -> dict[str, Any]:
        """One engine step: the scheduler, the stand-in forward, the worker connector (its puts
        waited for), the scheduler's update. Finished requests' kv_transfer_params."""
        from vllm.model_executor.models.extract_hidden_states import basic_cache

        out = self.scheduler.schedule()
        for new in out.scheduled_new_reqs:
            self.tables[new.req_id] = list(new.block_ids[self.gid])
        cached = out.scheduled_cached_reqs
        for req_id, ids in zip(cached.req_ids, cached.new_block_ids, strict=True):
            self.tables[req_id] += list(ids[self.gid]) if ids else []
        done = set()
        for req_id, n in out.num_scheduled_tokens.items():
            end = self.scheduler.requests[req_id].num_computed_tokens
            rows = prefix_rows(self.prompts[req_id])[end - n : end]
            basic_cache(rows, self.view, slots_for(self.tables[req_id], self.block, end)[end - n :])
            if end >= len(self.prompts[req_id]):
                done.add(req_id)
        for pending in out.kv_connector_metadata.pending_saves:
            self.manifests[pending.req_id] = pending.transfer_manifest
        self.worker.bind_connector_metadata(out.kv_connector_metadata)
        for future in list(self.worker._req_futures.values()):
            future.exception(WAIT_S)  # the put, or its failure (logged by the connector)
        sent, _ = self.worker.get_finished(out.finished_req_ids)
        self.worker.clear_connector_metadata()
        output = planning.model_output(out, dict.fromkeys(done, 7), frozenset(sent or ()))
        results = self.scheduler.update_from_output(out, output)
        outputs = [o for r in results.values() for o in r.outputs if o.finished]
        return {o.request_id: o.kv_transfer_params for o in outputs}

    def settle(self) -> None:
        """Steps until every finished request's blocks are back."""
        started = time.monotonic()
        while self.scheduler.requests:
            assert time.monotonic() - started < WAIT_S, list(self.scheduler.requests)
            self.step()


@pytest.fixture
def rig(store, tmp_path, monkeypatch):  # noqa: F811 (the imported fixture)
    from hs_connectors.mooncake_hidden_states_connector import MooncakeHiddenStatesConnector
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    monkeypatch.setenv("MOONCAKE_LOCAL_HOSTNAME", LOOPBACK)  # else the host's name resolves
    # As speculators' launcher builds it; no segment of its own, a small staging buffer.
    argv = ("--mooncake-master", store.master, "--mooncake-global-segment-gib", "0")
    argv += ("--mooncake-local-buffer-gib", "0.0625", "--mooncake-writer-threads", "1")
    config = config_for("mooncake", tmp_path, chunks=None, extra=argv)
    chunked(config, CHUNK)
    kv = planning.plan(config, planning.layer_specs(config), 64 << 20)
    scheduler, request = planning.engine_scheduler(config, kv)
    assert isinstance(scheduler.connector, MooncakeHiddenStatesConnector)
    gid, group = hidden_group(kv)
    tp_world(config)
    worker = MooncakeHiddenStatesConnector(config, KVConnectorRole.WORKER, kv)
    worker._device_module = torch.cpu  # torch.accelerator finds no device on the CPU
    view = plain_view(kv)
    view.copy_(torch.randn(view.shape) * 100)  # rows other requests left
    worker.register_kv_caches({group.layer_names[0]: view})
    yield Rig(scheduler, request, worker, view, gid, group.kv_cache_spec.block_size)
    if worker._executor is not None:
        worker._executor.shutdown(wait=True)


def request_id(case: str) -> str:
    """An id of vLLM's form: "cmpl-", the client's id, the prompt's index, 8 random hex."""
    return f"cmpl-{case}-0-1a2b3c4d"


def abort(rig: Rig, case: str) -> tuple[str, list[int]]:
    """A request that ends before its whole prompt is computed: its id and prompt."""
    from vllm.v1.request import RequestStatus

    prompt = LONG
    if case == "last-block":  # one chunk computed, the rest of the prompt in its last block
        room = -CHUNK % rig.block
        if not room:
            pytest.skip(f"block size {rig.block} divides the chunk: no prompt ends in its block")
        prompt = LONG[: CHUNK + room]
    req_id = request_id(case)
    rig.add(req_id, prompt)
    if case != "waiting":
        rig.step()
        request = rig.scheduler.requests[req_id]
        assert 0 < request.num_computed_tokens < len(prompt)
    if case == "preempted":  # as vLLM's scheduler preempts: off the running queue, blocks freed
        request = rig.scheduler.requests[req_id]
        rig.scheduler.running.remove(request)
        rig.scheduler._preempt_request(request, time.monotonic())
    rig.scheduler.finish_requests(req_id, RequestStatus.FINISHED_ABORTED)
    return req_id, prompt


def objects(transfer: Any, key: str) -> dict[str, int]:
    """What the store holds under a sample's key and its error marker's: name -> size."""
    raw = transfer.store._store
    return {k: raw.get_size(k) for k in (key, key + ":error") if raw.is_exist(k) == 1}


CASES = ["mid-prompt", "last-block", "preempted", "waiting"]


@needs(PATCH)
@pytest.mark.parametrize("case", CASES)
def test_an_aborted_prompt_puts_nothing_and_a_whole_one_round_trips(rig, store, case):  # noqa: F811
    from speculators.data_generation.offline import check_hidden_states

    free = rig.scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
    req_id, prompt = abort(rig, case)
    rig.settle()
    assert rig.scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == free
    transfer = trainer_transfer(store)
    assert objects(transfer, req_id) == {}  # the id is a safe key as it is

    # The client's retry: the same prompt, a new request (vLLM's id is new), whole.
    rig.add("cmpl-retry-0-5e6f7a8b", prompt)
    params: dict[str, Any] = {}
    while "cmpl-retry-0-5e6f7a8b" not in params:
        params.update(rig.step())
    rig.settle()  # its put: the step after it finished
    manifest = params["cmpl-retry-0-5e6f7a8b"]
    got = transfer.get_generated(manifest)
    check_hidden_states(got, prompt)
    assert torch.equal(got["hidden_states"], prefix_rows(prompt))
    transfer.delete(manifest["handle"])


def test_without_the_patch_an_aborted_prompt_leaves_an_object_nobody_reads(rig, store):  # noqa: F811
    """What hs-connectors 0.9.0 does alone (docs/mooncake.md): a full-size sample with rows
    never computed where the blocks cover the prompt, else an error marker."""
    from speculators.data_generation.offline import check_hidden_states

    transfer = trainer_transfer(store)
    left, prompts = {}, {}
    with without(PATCH):
        for case in CASES:
            req_id, prompts[case] = abort(rig, case)
            rig.settle()
            left[case] = objects(transfer, req_id)  # the id is a safe key as it is
    print(left)
    error = {c: {f"{request_id(c)}:error"} for c in ("mid-prompt", "preempted", "waiting")}
    assert {c: set(o) for c, o in left.items()} == {**error, "last-block": {request_id(CASES[1])}}
    # What the trainer would read, had it the manifest: the prompt, rows past the chunk stale.
    manifest = rig.manifests[request_id(CASES[1])]
    assert left["last-block"][manifest["handle"]] == manifest["metadata"]["total_aligned_bytes"]
    got, prompt = transfer.get_generated(manifest), prompts["last-block"]
    check_hidden_states(got, prompt)  # the trainer's check takes it as whole
    rows = prefix_rows(prompt)
    assert torch.equal(got["hidden_states"][:CHUNK], rows[:CHUNK])
    assert not torch.equal(got["hidden_states"][CHUNK:], rows[CHUNK:])
