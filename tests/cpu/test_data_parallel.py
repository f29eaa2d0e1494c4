"""Data-parallel extraction on the CPU: what each engine core plans, and whose file is whose.

With `--data-parallel-size N` one front end feeds N engine cores, each with the config vLLM
builds once; several independent engines (one per GPU) may share one folder too. What must
hold: every rank keeps the hybrid KV cache manager and the hidden-state group, and plans
exactly as a single engine; two engines given the same request id (`vllm.LLM` numbers its
requests 0, 1, ... in every process) still write different files.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
from conftest import IDS, MEMORY, NO_CHUNKED_PREFILL, model_dir

from speculators_hybrid import planning
from speculators_hybrid.vllm_patches.file_names import hidden_states_path


def dp_config(dp: int):
    return planning.engine_config(
        planning.Setup(
            model=model_dir("qwen3.6-27b"),
            layer_ids=IDS,
            max_model_len=8192,
            data_parallel_size=dp,
            chunked_prefill=False if NO_CHUNKED_PREFILL else None,  # 0.22-0.23 refuse it
            max_num_batched_tokens=8192 if NO_CHUNKED_PREFILL else None,
        )
    )


def groups(config) -> list[tuple[list[str], object]]:
    kv = planning.plan(config, planning.layer_specs(config), MEMORY)
    return [(g.layer_names, g.kv_cache_spec) for g in kv.kv_cache_groups]


def test_every_data_parallel_rank_plans_as_one_engine(shim):
    one, two = dp_config(1), dp_config(2)
    assert two.parallel_config.data_parallel_size == 2
    assert two.scheduler_config.disable_hybrid_kv_cache_manager is False
    assert two.kv_transfer_config.kv_connector == one.kv_transfer_config.kv_connector
    alone = groups(one)
    assert alone[-1][0] == [planning.hidden_state_layer(one)[0]]  # the hidden-state group
    for rank in range(2):  # each engine core gets the same config with its own rank
        ranked = copy.deepcopy(two)
        ranked.parallel_config.data_parallel_rank = rank
        ranked.parallel_config.data_parallel_rank_local = rank
        assert groups(ranked) == alone


@pytest.mark.parametrize("external", ["0", "cmpl-7f3a", "../x"])
def test_engines_that_share_a_folder_name_the_same_request_apart(external, tmp_path):
    from vllm.v1.engine.input_processor import InputProcessor

    made = []
    for _engine in range(2):  # one per process, each numbering its requests from 0
        request = SimpleNamespace(request_id=external, external_req_id=None)
        InputProcessor.assign_request_id(request)  # vLLM's own: adds 8 random characters
        made.append(hidden_states_path(str(tmp_path), request.request_id))
    assert made[0] != made[1]
    assert all(p.startswith(str(tmp_path) + "/") for p in made)
