"""The Mooncake backend end to end against a real store on loopback (tests/cpu/mooncake_store.py):
hs-connectors' `MooncakeHiddenStatesConnector` puts a hybrid target's hidden states as vLLM
calls it (scheduler side, then worker side), and the trainer's side, built as `speculators
train --hidden-states-backend mooncake` builds it, gets, checks and deletes them.

Runs in tox's mooncake env; elsewhere it skips when `mooncake.store` cannot load (the reason is
the loader's error)."""

from __future__ import annotations

import argparse
import os
import time

import pytest
import torch
from conftest import engine_config, engine_scheduler
from mooncake_store import LOOPBACK, running_store

from speculators_hybrid import planning

REQUIRED = os.environ.get("SPECULATORS_HYBRID_MOONCAKE") == "1"  # tox's mooncake env
try:
    from mooncake.store import MooncakeDistributedStore  # noqa: F401
except ImportError as exc:
    if REQUIRED:
        raise
    pytest.skip(f"mooncake.store does not load: {exc}", allow_module_level=True)

pytest.importorskip("hs_connectors.mooncake_hidden_states_connector")
pytest.importorskip("speculators")

MEMORY = 1 << 30
WAIT_S = 30.0  # the connector's put, reported by get_finished


@pytest.fixture
def store(tmp_path):
    with running_store(tmp_path) as running:
        yield running
    assert all(p.poll() is not None for p in running.processes)  # none left behind


@pytest.fixture
def one_rank(tmp_path):
    """vLLM's process groups for one CPU rank (the worker side asks for its TP rank)."""
    from vllm.config import set_current_vllm_config
    from vllm.distributed import parallel_state as ps

    if ps.model_parallel_is_initialized():
        yield
        return
    with set_current_vllm_config(engine_config(preset="tiny", ids=(2, 5, 8), max_model_len=4096)):
        ps.init_distributed_environment(1, 0, f"file://{tmp_path / 'init'}", 0, "gloo")
        ps.initialize_model_parallel(1, 1)
    yield
    ps.destroy_model_parallel()
    ps.destroy_distributed_environment()


def _producer_config(store):
    config = engine_config(preset="tiny", ids=(2, 5, 8), max_model_len=4096)
    config.kv_transfer_config.kv_connector_extra_config["mooncake"] = {
        "local_hostname": LOOPBACK,
        "metadata_server": "P2PHANDSHAKE",
        "master_server_address": store.master,
        "global_segment_size": 0,  # the objects live in the store process's segment
        "local_buffer_size": 0,
        "protocol": "tcp",
        "num_writer_threads": 1,
    }
    return config


def _hidden_group(kv):
    from vllm.v1.kv_cache_interface import HiddenStateCacheSpec

    groups = kv.kv_cache_groups
    found = [i for i, g in enumerate(groups) if isinstance(g.kv_cache_spec, HiddenStateCacheSpec)]
    assert len(found) == 1, kv.kv_cache_groups
    return found[0]


def trainer_transfer(store):
    """The trainer's transfer, as `speculators train` makes it from its arguments."""
    from hs_connectors import HiddenStatesBackend

    backend = HiddenStatesBackend.registry["mooncake"]
    parser = argparse.ArgumentParser()
    backend.add_train_args(parser)
    args = parser.parse_args(
        ["--mooncake-master", store.master, "--mooncake-global-segment-gib", "0"]
        + ["--mooncake-local-buffer-gib", "0"]
    )
    transfer = backend.from_train_args(args, "unused")
    transfer.setup()
    return transfer


def test_connector_put_then_trainer_get_and_delete(store, one_rank, monkeypatch):
    from hs_connectors.mooncake_hidden_states_connector import MooncakeHiddenStatesConnector
    from speculators.data_generation.offline import check_hidden_states
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.v1.core.sched.output import SchedulerOutput

    monkeypatch.setenv("MOONCAKE_LOCAL_HOSTNAME", LOOPBACK)  # else the host's name resolves
    config = _producer_config(store)
    kv = planning.plan(config, planning.layer_specs(config), MEMORY)
    group = _hidden_group(kv)
    block = kv.kv_cache_groups[group].kv_cache_spec.block_size
    _scheduler, request = engine_scheduler(config, kv)

    # Scheduler side: the request finishes; the manifest goes back with the HTTP response.
    scheduler = MooncakeHiddenStatesConnector(config, KVConnectorRole.SCHEDULER, kv)
    prompt = list(range(100, 100 + 2 * block + 7))
    blocks = [5, 1, 3]  # not in order, as the KV cache manager hands them out
    per_group = tuple(blocks if i == group else [] for i in range(len(kv.kv_cache_groups)))
    finished = request("req-1", prompt)
    finished.num_computed_tokens = len(prompt)  # as vLLM finishes it: its whole prompt computed
    delay, manifest = scheduler.request_finished_all_groups(finished, per_group)
    assert delay and manifest["handle"] == "req-1"
    meta = scheduler.build_connector_meta(SchedulerOutput.make_empty())

    # Worker side: vLLM's own extraction layer and a cache holding the states at the blocks.
    worker = MooncakeHiddenStatesConnector(config, KVConnectorRole.WORKER, kv)
    # torch.accelerator finds no device on the CPU; torch's CPU module has the same stream API.
    worker._device_module = torch.cpu
    name, _layer = planning.hidden_state_layer(config)
    ids, hidden = 3, config.model_config.get_hidden_size()
    cache = torch.zeros(8, block, ids, hidden, dtype=config.model_config.dtype)
    worker.register_kv_caches({name: cache})
    states = torch.randn(len(prompt), ids, hidden).to(cache.dtype)
    for at, row in enumerate(states):
        cache[blocks[at // block], at % block] = row
    worker.bind_connector_metadata(meta)
    started = time.perf_counter()
    done = worker.get_finished({"req-1"})[0]
    while not done:
        assert time.perf_counter() - started < WAIT_S, "the connector's put did not finish"
        time.sleep(0.01)
        done = worker.get_finished(set())[0]
    assert done == {"req-1"}
    put_s = time.perf_counter() - started

    # Trainer side: get, check as the trainer checks, delete.
    transfer = trainer_transfer(store)
    started = time.perf_counter()
    got = transfer.get_generated(manifest)
    get_s = time.perf_counter() - started
    check_hidden_states(got, prompt)
    assert got["hidden_states"].dtype == cache.dtype
    assert torch.equal(got["hidden_states"], states)
    assert got["token_ids"].tolist() == prompt
    transfer.delete(manifest["handle"])
    with pytest.raises(TimeoutError):  # gone: the trainer's wait for it runs out
        transfer.store.get_sample(manifest, timeout=0.2)
    shape = "x".join(map(str, states.shape))
    took = f"put {put_s * 1e3:.1f} ms, get {get_s * 1e3:.1f} ms"
    print(f"mooncake round trip, {shape} {states.dtype}: {took}")
