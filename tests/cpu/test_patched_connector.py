"""vLLM's own ExampleHiddenStatesConnector as our diffs change it (patches/vllm, vLLM < 0.22).

Runs only against a vLLM whose source carries the diffs (SPECULATORS_HYBRID_PATCHED_VLLM=1,
tests/upstream), where the shim's connector tests are skipped: the same contract, checked on
the connector vLLM's config names, driven by vLLM's scheduler. One complete file per prompt,
written once, from the hidden-state group's blocks read with that group's block size.
"""

from __future__ import annotations

import os

import pytest
import torch
from conftest import PATCHED_VLLM, engine_config, engine_scheduler, model_output, needs
from safetensors.torch import load_file

from speculators_hybrid import planning
from speculators_hybrid.vllm_patches.connector import slots_for

pytestmark = [
    needs("keep-hma-for-extraction"),
    pytest.mark.skipif(not PATCHED_VLLM, reason="tests vLLM's connector as patches/vllm fixes it"),
]

IDS = (2, 5, 8)


def _steps(scheduler, req_id: str):
    """Schedule to completion: the connector metadata of each step and the request's output."""
    metas = []
    for _ in range(20):
        out = scheduler.schedule()
        metas.append(out.kv_connector_metadata)
        done = planning.prompts_done(scheduler, out)
        block_ids = scheduler.kv_cache_manager.get_block_ids(req_id)
        results = scheduler.update_from_output(out, model_output(out, {r: 7 for r in done}))
        outputs = [o for eco in results.values() for o in eco.outputs]
        if outputs:
            return metas, outputs[0], block_ids
    raise AssertionError("request did not finish")


def test_a_chunked_prompt_gives_one_complete_file_from_the_hidden_group(tmp_path, monkeypatch):
    from vllm.distributed.kv_transfer.kv_connector.v1 import example_hidden_states_connector
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.model_executor.models.extract_hidden_states import CacheOnlyAttentionMetadata
    from vllm.v1.kv_cache_interface import HiddenStateCacheSpec

    config = engine_config(preset="tiny", ids=IDS, prefix_caching=True, max_model_len=4096)
    config.kv_transfer_config.kv_connector_extra_config["shared_storage_path"] = str(tmp_path)
    assert config.kv_transfer_config.kv_connector == "ExampleHiddenStatesConnector"
    assert config.scheduler_config.disable_hybrid_kv_cache_manager is False
    config.scheduler_config.max_num_batched_tokens = 512  # several prefill chunks
    kv = planning.plan(config, planning.layer_specs(config), 64 << 20)
    scheduler, request = engine_scheduler(config, kv)
    (group,) = [
        i
        for i, g in enumerate(kv.kv_cache_groups)
        if isinstance(g.kv_cache_spec, HiddenStateCacheSpec)
    ]
    block = kv.kv_cache_groups[group].kv_cache_spec.block_size
    assert group != 0 and block != config.cache_config.block_size  # group 0's would be wrong

    prompt = list(range(1, 1300))
    scheduler.add_request(request("long", prompt))
    metas, output, block_ids = _steps(scheduler, "long")

    saves = [m.requests for m in metas]
    assert len(saves) >= 2 and all(not s for s in saves[:-1])  # nothing before the last chunk
    (save,) = saves[-1]
    expected = slots_for(block_ids[group], block, len(prompt))
    assert save.token_ids.tolist() == prompt
    assert torch.equal(save.slot_mapping[: len(prompt)], expected)
    path = str(tmp_path / "long.safetensors")
    assert save.filename == path and output.kv_transfer_params == {"hidden_states_path": path}

    # The worker side writes what those slots hold. One process: no tensor-parallel group.
    monkeypatch.setattr(
        example_hidden_states_connector, "get_tensor_model_parallel_rank", lambda: 0
    )
    name, _ = planning.hidden_state_layer(config)
    worker = type(scheduler.connector)(config, KVConnectorRole.WORKER, kv)
    cache = torch.zeros(int(expected.max()) // block + 1, block, len(IDS), 16)
    cache.view(-1, len(IDS), 16)[:] = torch.arange(cache.shape[0] * block)[:, None, None]
    worker.register_kv_caches({name: cache})
    worker.bind_connector_metadata(metas[-1])
    worker.save_kv_layer(name, cache, CacheOnlyAttentionMetadata(expected))
    data = load_file(path)
    assert data["token_ids"].tolist() == prompt
    assert torch.equal(data["hidden_states"][:, 0, 0], expected.to(torch.float32))
    assert sorted(os.listdir(tmp_path)) == ["long.safetensors", "long.safetensors.lock"]
