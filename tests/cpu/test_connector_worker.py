"""The connector's worker side on the CPU: the file it writes, from a real cache view."""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time

import pytest
import torch
from conftest import engine_config, needs
from safetensors import safe_open
from safetensors.torch import load_file

from speculators_hybrid import planning, switches
from speculators_hybrid.vllm_patches import writer
from speculators_hybrid.vllm_patches.connector import (
    HiddenStatesMetadata,
    HybridHiddenStatesConnector,
    SaveRequest,
    slots_for,
)

pytestmark = needs("keep-hma-for-extraction")


def test_worker_writes_the_file_speculators_reads(shim, tmp_path):
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    config = engine_config(preset="tiny", ids=(2, 5, 8), prefix_caching=True, max_model_len=4096)
    config.kv_transfer_config.kv_connector_extra_config["shared_storage_path"] = str(tmp_path)
    name, _layer = planning.hidden_state_layer(config)  # registers vLLM's own layer
    connector = HybridHiddenStatesConnector(config, KVConnectorRole.WORKER)

    block, ids, hidden = 16, 3, 256
    cache = torch.zeros(12, block, ids, hidden, dtype=torch.bfloat16)
    connector.register_kv_caches({name: cache, "model.layers.3.self_attn.attn": torch.zeros(1)})

    prompt = list(range(100, 140))
    slots = slots_for([9, 2, 4], block, len(prompt))
    states = torch.randn(len(prompt), ids, hidden).to(torch.bfloat16)
    cache[slots // block, slots % block] = states
    path = os.path.join(tmp_path, "req-1.safetensors")
    meta = HiddenStatesMetadata([SaveRequest("req-1", path, prompt, slots)])
    connector.bind_connector_metadata(meta)
    connector.save_kv_layer("model.layers.3.self_attn.attn", cache, None)  # not ours: ignored
    assert not os.path.exists(path)
    connector.save_kv_layer(name, cache, None)
    with open(f"{path}.lock") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # as speculators' reader: wait for the writer
    connector.shutdown()

    data = load_file(path)
    with safe_open(path, "pt") as f:
        meta = f.metadata()
    assert meta["writer"] == "speculators-hybrid" and meta["vllm_version"].startswith("0.2")
    assert json.loads(meta["layer_ids"]) == [2, 5, 8]
    assert "hidden-states-write-slots" in json.loads(meta["speculators_hybrid_patches"])
    assert meta["model"] == config.model_config.model and len(meta["model_config_sha256"]) == 64
    assert set(data) == {"hidden_states", "token_ids"}
    assert data["token_ids"].dtype == torch.int64 and data["token_ids"].tolist() == prompt
    assert data["hidden_states"].dtype == torch.bfloat16
    assert torch.equal(data["hidden_states"], states)
    # No partial file left; the lock file stays, unlocked, for speculators' reader to remove.
    assert sorted(os.listdir(tmp_path)) == ["req-1.safetensors", "req-1.safetensors.lock"]
    with open(f"{path}.lock") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_guard_refuses_nan_or_all_zero_rows(shim, tmp_path, monkeypatch):
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    config = engine_config(preset="tiny", ids=(2, 5, 8), prefix_caching=True, max_model_len=4096)
    config.kv_transfer_config.kv_connector_extra_config["shared_storage_path"] = str(tmp_path)
    config.kv_transfer_config.kv_connector_extra_config["refuse_bad_hidden_states"] = True
    name, _layer = planning.hidden_state_layer(config)
    connector = HybridHiddenStatesConnector(config, KVConnectorRole.WORKER)
    cache = torch.randn(8, 16, 3, 256).to(torch.bfloat16)
    connector.register_kv_caches({name: cache})

    slots = slots_for([1, 2], 16, 20)
    cache[2, 1] = 0  # token 17: all ids, all zero (what vLLM 0.24.x was reported to write)
    saves = [
        SaveRequest("zero", str(tmp_path / "zero.safetensors"), list(range(20)), slots),
        SaveRequest("good", str(tmp_path / "good.safetensors"), list(range(16)), slots[:16]),
    ]
    connector.bind_connector_metadata(HiddenStatesMetadata(saves))
    connector.save_kv_layer(name, cache, None)
    assert not (tmp_path / "zero.safetensors").exists()
    assert (
        "all-zero hidden states at token rows 17"
        in (tmp_path / "zero.safetensors.rejected").read_text()
    )
    assert (tmp_path / "good.safetensors").exists()

    cache[1, 3, 0, 0] = float("nan")  # token 3
    connector.bind_connector_metadata(
        HiddenStatesMetadata(
            [SaveRequest("nan", str(tmp_path / "nan.safetensors"), [1] * 16, slots[:16])]
        )
    )
    connector.save_kv_layer(name, cache, None)
    assert "NaN or Inf at token rows 3" in (tmp_path / "nan.safetensors.rejected").read_text()


def async_connector(tmp_path, kind=HybridHiddenStatesConnector, **extra):
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    config = engine_config(preset="tiny", ids=(2, 5, 8), prefix_caching=True, max_model_len=4096)
    config.kv_transfer_config.kv_connector_extra_config.update(
        shared_storage_path=str(tmp_path), **extra
    )
    name, _layer = planning.hidden_state_layer(config)
    connector = kind(config, KVConnectorRole.WORKER)
    cache = torch.randn(12, 16, 3, 256).to(torch.bfloat16)
    connector.register_kv_caches({name: cache})
    return connector, name, cache


def test_async_writes_return_first_and_readers_wait_for_whole_files(shim, tmp_path, monkeypatch):
    connector, name, cache = async_connector(tmp_path, async_writes=True)
    release = threading.Event()
    real = writer.save_whole

    def held(*args, **kwargs):  # the disk is slow: the step must not wait for it
        assert release.wait(30)
        real(*args, **kwargs)

    monkeypatch.setattr(writer, "save_whole", held)
    requests = {f"req-{i}": slots_for([11 - i, i], 16, 20 + i) for i in range(4)}
    saves = [
        SaveRequest(r, str(tmp_path / f"{r}.safetensors"), list(range(len(s))), s)
        for r, s in requests.items()
    ]
    connector.bind_connector_metadata(HiddenStatesMetadata(saves))
    connector.save_kv_layer(name, cache, None)  # returns with every write still pending

    for save in saves:
        assert not os.path.exists(save.path)
        with open(f"{save.path}.lock") as lock, pytest.raises(BlockingIOError):
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held by the writer
    release.set()
    for save in saves:
        with open(f"{save.path}.lock") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # what speculators' reader does, then it reads
            data = load_file(save.path)
        expected = cache[save.slots // 16, save.slots % 16]
        assert torch.equal(data["hidden_states"], expected)
        assert data["token_ids"].tolist() == save.token_ids
    connector.shutdown()
    names = sorted(os.listdir(tmp_path))
    assert names == sorted(
        [f"{r}.safetensors" for r in requests] + [f"{r}.safetensors.lock" for r in requests]
    )


@pytest.mark.parametrize(
    ("setting", "off_the_step"),
    [
        ({}, True),  # the default
        ({"env": "0"}, False),
        ({"env": "false"}, False),
        ({"extra": False}, False),
        ({"extra": "false"}, False),
        ({"extra": False, "env": "1"}, False),  # either one turns them off
        ({"env": "1"}, True),
        ({"guard": True}, False),  # the guard's verdict is needed before the request ends
    ],
)
def test_writes_are_off_the_step_by_default(shim, tmp_path, monkeypatch, setting, off_the_step):
    monkeypatch.delenv(switches.ASYNC_WRITES, raising=False)
    if "env" in setting:
        monkeypatch.setenv(switches.ASYNC_WRITES, setting["env"])
    extra: dict = {}
    if "extra" in setting:
        extra["async_writes"] = setting["extra"]
    if setting.get("guard"):
        extra["refuse_bad_hidden_states"] = True
    connector, _, _ = async_connector(tmp_path, **extra)
    assert (connector._writer is not None) == off_the_step
    connector.shutdown()


@pytest.mark.parametrize(
    ("extra", "env", "side_by_side"),
    [({}, None, writer.THREADS), ({"num_writer_threads": 3}, None, 3), ({}, "2", 2)],
)
def test_files_are_written_side_by_side(shim, tmp_path, monkeypatch, extra, env, side_by_side):
    """As many files are written at once as there are writer threads (8 unless set)."""
    monkeypatch.delenv(switches.WRITER_THREADS, raising=False)
    if env is not None:
        monkeypatch.setenv(switches.WRITER_THREADS, env)
    connector, name, cache = async_connector(tmp_path, **extra)
    release, inside, lock = threading.Event(), [], threading.Lock()
    real = writer.save_whole

    def held(*args, **kwargs):
        with lock:
            inside.append(args[0])
        assert release.wait(30)
        real(*args, **kwargs)

    monkeypatch.setattr(writer, "save_whole", held)
    saves = [
        SaveRequest(f"r{i}", str(tmp_path / f"r{i}.safetensors"), [1, 2], slots_for([i], 16, 2))
        for i in range(writer.THREADS + 2)
    ]
    connector.bind_connector_metadata(HiddenStatesMetadata(saves))
    connector.save_kv_layer(name, cache, None)
    deadline = time.monotonic() + 30
    while len(inside) < side_by_side and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)  # time for one more thread to come in, if there were one
    assert len(inside) == side_by_side
    release.set()
    connector.shutdown()
    assert all(os.path.exists(save.path) for save in saves)


@pytest.mark.parametrize("bad", ["0", "many", "-1"])
def test_a_bad_writer_thread_count_is_refused(shim, tmp_path, monkeypatch, bad):
    monkeypatch.setenv(switches.WRITER_THREADS, bad)
    with pytest.raises(ValueError, match=f"whole number >= 1, got '{bad}'"):
        async_connector(tmp_path)


def test_a_write_that_cannot_be_queued_releases_its_lock(tmp_path):
    files = writer.FileWriter(threads=1)
    files.shutdown()  # no thread left to write
    path = str(tmp_path / "r.safetensors")
    with pytest.raises(RuntimeError) as failure:
        files.submit(path, {"hidden_states": torch.zeros(2, 1, 4)}, None)
    assert failure.traceback  # its frames (and their open files) are still alive here
    with open(f"{path}.lock") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a reader would not wait forever
