"""The connector's worker side on the CPU: the file it writes, from a real cache view."""

from __future__ import annotations

import fcntl
import json
import os

import torch
from conftest import engine_config, needs
from safetensors import safe_open
from safetensors.torch import load_file

from speculators_hybrid import planning
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
