"""The connector's scheduler side and the KV cache manager, driven by vLLM's real scheduler."""

from __future__ import annotations

import pytest
import torch
from conftest import engine_config, engine_scheduler, model_output, needs

from speculators_hybrid import planning
from speculators_hybrid.vllm_patches.connector import HybridHiddenStatesConnector, slots_for
from speculators_hybrid.vllm_patches.spec import HiddenStatesCacheSpec

pytestmark = needs("keep-hma-for-extraction", "hidden-states-own-group")

MEMORY = 8 << 30


@pytest.fixture
def setup(shim):
    config = engine_config(prefix_caching=True, max_model_len=8192)
    kv = planning.plan(config, planning.layer_specs(config), MEMORY)
    scheduler, request = engine_scheduler(config, kv)
    group = next(
        i
        for i, g in enumerate(kv.kv_cache_groups)
        if isinstance(g.kv_cache_spec, HiddenStatesCacheSpec)
    )
    return config, kv, scheduler, request, group


def _run(scheduler, req):
    """Schedule `req` to completion; return the saves of each step and the final output."""
    saves = []
    for _ in range(10):
        out = scheduler.schedule()
        saves.append(list(out.kv_connector_metadata.saves))
        done = planning.prompts_done(scheduler, out)
        block_ids = scheduler.kv_cache_manager.get_block_ids(req.request_id)
        results = scheduler.update_from_output(out, model_output(out, {r: 7 for r in done}))
        outputs = [o for eco in results.values() for o in eco.outputs]
        if outputs:
            return saves, outputs, block_ids
    raise AssertionError("request did not finish")


def test_prompt_longer_than_a_chunk_gives_one_complete_save(setup):
    config, kv, scheduler, request, group = setup
    assert isinstance(scheduler.connector, HybridHiddenStatesConnector)
    chunk = config.scheduler_config.max_num_batched_tokens
    prompt = list(range(1, chunk + 901))
    req = request("long", prompt)
    scheduler.add_request(req)
    saves, outputs, block_ids = _run(scheduler, req)

    # Several prefill chunks; nothing is saved until the last one, which saves the whole prompt.
    assert len(saves) >= 2
    assert [len(s) for s in saves] == [0] * (len(saves) - 1) + [1]
    save = saves[-1][0]
    assert save.token_ids == prompt
    block = kv.kv_cache_groups[group].kv_cache_spec.block_size
    expected = slots_for(block_ids[group], block, len(prompt))
    assert torch.equal(save.slots, expected)
    assert len(set(save.slots.tolist())) == len(prompt)
    assert save.path.endswith("long.safetensors")
    assert outputs[0].kv_transfer_params == {"hidden_states_path": save.path}


def test_prefix_cache_hit_reuses_hidden_state_blocks(setup):
    config, kv, scheduler, request, group = setup
    base = config.cache_config.block_size
    shared = list(range(1, 3 * base + 1))
    first = request("first", shared + [5, 6, 7])
    scheduler.add_request(first)
    first_saves, _, first_blocks = _run(scheduler, first)

    second = request("second", shared + [9, 9])
    scheduler.add_request(second)
    out = scheduler.schedule()
    assert out.scheduled_new_reqs[0].num_computed_tokens > 0  # a real prefix-cache hit
    hit = out.scheduled_new_reqs[0].num_computed_tokens
    save = out.kv_connector_metadata.saves[0]
    # The cached part of the file is read from the blocks the first request wrote.
    first_slots = first_saves[-1][0].slots
    assert torch.equal(save.slots[:hit], first_slots[:hit])
    assert save.token_ids == second.prompt_token_ids


def test_engine_block_size_stays_the_models(setup):
    """The engine core takes min() over all groups' block sizes; ours must not win it."""
    config, kv, scheduler, request, group = setup
    model_groups = [g for i, g in enumerate(kv.kv_cache_groups) if i != group]
    engine_block = min(g.kv_cache_spec.block_size for g in model_groups)
    assert kv.kv_cache_groups[group].kv_cache_spec.block_size < engine_block
    assert config.cache_config.block_size == engine_block
    assert scheduler.block_size == engine_block  # scheduler block: mamba chunk alignment


def test_guard_turns_a_refused_file_into_a_request_error(setup, tmp_path):
    config, kv, scheduler, request, group = setup
    # As if built with kv_connector_extra_config {"refuse_bad_hidden_states": true}.
    scheduler.connector._guard = True
    scheduler.connector._dir = str(tmp_path)
    req = request("refused", list(range(1, 50)))
    scheduler.add_request(req)
    out = scheduler.schedule()
    (save,) = out.kv_connector_metadata.saves
    with open(f"{save.path}.rejected", "w") as marker:  # what the worker leaves when it refuses
        marker.write("all-zero hidden states at token rows 3")
    results = scheduler.update_from_output(out, model_output(out, {"refused": 7}))
    (output,) = [o for eco in results.values() for o in eco.outputs]
    assert output.kv_transfer_params == {
        "hidden_states_path": None,
        "hidden_states_error": "all-zero hidden states at token rows 3",
    }
