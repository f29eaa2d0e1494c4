"""hidden-states-read-slots (vLLM 0.24.x) and hidden-states-pad-slots (vLLM 0.22-0.24):
vLLM's own connector reads a prompt's hidden states back from the model runner's own
page-padded cache views, through its real scheduler and worker paths."""

from __future__ import annotations

import contextlib

import pytest
import torch
from conftest import PATCHER, engine_config, needs, vllm_patches
from upstream_worker import (  # noqa: F401 (cpu_copies: a fixture)
    VLLM,
    cpu_copies,
    extract,
    extraction,
    hidden_group,
    load,
    runner_views,
    storage,
    without,
)

from speculators_hybrid import planning

IDS = (2, 5, 8)
V1_VIEWS = VLLM.release < (0, 29)  # the views come from the V1 model runner's own methods
pytestmark = [
    pytest.mark.usefixtures("cpu_copies"),
    pytest.mark.skipif(VLLM.release < (0, 22), reason="vLLM's own connector is used from 0.22"),
]


def read_back(tmp_path, patch_id: str | None = None):
    """(states written, states the connector's file holds, engine block, extraction).

    The config and plan are built with every patch; `patch_id` is then left out for the run.
    """
    config = engine_config(preset="tiny", ids=IDS, prefix_caching=False, max_model_len=4096)
    storage(config, tmp_path)
    kv = planning.plan(config, planning.layer_specs(config), 64 << 20)
    raw, views = runner_views(config, kv)
    layer = hidden_group(kv)[1].layer_names[0]
    assert not views[layer].is_contiguous()  # strided: the page is padded
    with without(patch_id) if patch_id else contextlib.nullcontext():
        with extraction(config, kv, views[layer]) as ex:
            # A prompt over 3 of the hidden group's blocks; the blocks after them are free.
            states = torch.randn(2 * ex.block + 5, len(IDS), 256)
            params = extract(ex, "r", states)
            assert params == {"hidden_states_path": str(tmp_path / "r.safetensors")}
            got = load(params["hidden_states_path"])
    assert got["token_ids"].tolist() == list(range(1, len(states) + 1))
    return states.to(ex.view.dtype), got["hidden_states"], config.cache_config.block_size, ex


@pytest.mark.skipif(not V1_VIEWS, reason="the V1 model runner's views (vLLM < 0.29)")
@needs("hidden-states-read-slots")
class TestReadSlots:
    def test_without_the_fix_every_row_is_zero(self, shim, tmp_path):
        """The bug: reads with the engine's block size land in free blocks (issue 613)."""
        states, got, engine_block, ex = read_back(tmp_path, "hidden-states-read-slots")
        assert engine_block != ex.block  # the engine keeps the model's block size
        assert ex.worker._block_size == engine_block
        assert got.shape == states.shape
        assert not got.any()  # every row zero, no error anywhere

    def test_with_the_fix_the_rows_are_the_prompts(self, shim, tmp_path):
        states, got, engine_block, ex = read_back(tmp_path)
        assert engine_block != ex.block
        assert ex.worker._block_size == ex.block
        assert torch.equal(got, states)


READ_FIX = "hidden-states-read-slots" in {p.id for p in PATCHER.select(vllm_patches())}


# 0.22.x-0.23.x read in the forward pass with the layer's own slot mapping; 0.25.0 has PR 46301.
@pytest.mark.skipif(not V1_VIEWS or READ_FIX, reason="needs the fix, or no V1 runner views")
def test_upstream_reads_right_without_the_patch(shim, tmp_path):
    assert "hidden-states-read-slots" not in {p.id for p in PATCHER.selected}
    states, got, engine_block, ex = read_back(tmp_path)
    assert engine_block != ex.block
    assert torch.equal(got, states)


@pytest.mark.skipif(not V1_VIEWS, reason="the V1 model runner's views (vLLM < 0.29)")
@needs("hidden-states-pad-slots")
@pytest.mark.parametrize("patched", [False, True])
def test_padding_slots_leave_other_groups_pages_alone(shim, patched):
    """Padding (slot -1) lands in the last block of the cache, which any request may own (the
    page is shared with a layer of every other group)."""
    config = engine_config(preset="tiny", ids=IDS, prefix_caching=False, max_model_len=4096)
    kv = planning.plan(config, planning.layer_specs(config), 64 << 20)
    raw, views = runner_views(config, kv)
    spec = hidden_group(kv)[1].kv_cache_spec
    layer = hidden_group(kv)[1].layer_names[0]
    pages = raw[layer].view(kv.num_blocks, -1)
    pages[-1] = 7  # block num_blocks-1: another request's data
    before = pages[-1].clone()
    values = torch.ones(4, len(IDS), 256, dtype=spec.dtype)
    with contextlib.nullcontext() if patched else without("hidden-states-pad-slots"):
        from vllm.model_executor.models.extract_hidden_states import basic_cache

        basic_cache(values, views[layer], torch.tensor([spec.block_size + 1, -1, -1, -1]))
    last_page_kept = torch.equal(pages[-1], before)
    assert last_page_kept is patched
    if patched:
        assert torch.equal(views[layer][0, 0], values[1])  # padding: the null block 0
    assert torch.equal(views[layer][1, 1], values[0])
