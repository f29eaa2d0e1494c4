"""hidden-states-chunked-prompts (vLLM 0.22-0.23): chunked prefill with hybrid extraction.

vLLM's own config refuses its `ExampleHiddenStatesConnector` with chunked prefill there; with
the patch, our connector is named in its place where chunked prefill is on (with the diff in
patches/vllm, vLLM's own connector takes chunks), and a prompt prefilled in several steps gives
one complete file, read from the slots its rows were written to (vLLM's scheduler and KV cache
manager, both sides of the connector, vLLM's reader). Prefix caching through the same
connector: test_prefix_hit_file.py (full tier).
"""

from __future__ import annotations

import pytest
import torch
from conftest import PATCHED_VLLM, PATCHER, model_dir
from test_prefix_hit_file import FIRST, Engine, engine, prefix_keys, rows
from upstream_worker import VLLM, cpu_copies, without  # noqa: F401 (cpu_copies: a fixture)

from speculators_hybrid import planning
from speculators_hybrid.vllm_patches.chunked_prompts import PATCH
from speculators_hybrid.vllm_patches.hma_config import CONNECTOR, STOCK_CONNECTOR

pytestmark = pytest.mark.skipif(not PATCH.needed_for(str(VLLM)), reason="vLLM 0.22-0.23 only")


def config(chunked: bool | None):
    setup = planning.Setup(
        model=model_dir("tiny"), layer_ids=(1, 4, 5, 8), max_model_len=4096, chunked_prefill=chunked
    )
    return planning.engine_config(setup)


def test_without_the_patch_vllm_refuses_chunked_prefill(shim):
    with without(PATCH.id), pytest.raises(ValueError, match="does not support chunked prefill"):
        config(None)  # vLLM's default: chunked prefill on


@pytest.mark.shim_only  # our connector class; the diffs change vLLM's own
def test_our_connector_where_chunked_prefill_is_on_vllms_where_it_is_off(shim):
    on, off = config(None), config(False)
    assert on.scheduler_config.enable_chunked_prefill
    assert on.kv_transfer_config.kv_connector == CONNECTOR
    assert off.kv_transfer_config.kv_connector == STOCK_CONNECTOR


@pytest.mark.usefixtures("cpu_copies")
def test_a_prompt_in_several_steps_gives_one_complete_file(shim, tmp_path):
    assert PATCHED_VLLM or PATCH.id in {p.id for p in PATCHER.selected}
    with engine(tmp_path, caching=False) as ex:
        run = Engine(ex).run("chunked", FIRST)
    assert len(run.steps) >= 3  # 1,500 tokens in steps of at most 512
    assert run.read_keys == prefix_keys(FIRST)  # each row from the slot it was written to
    assert run.file["token_ids"].tolist() == FIRST
    assert torch.equal(run.file["hidden_states"], rows(FIRST))
