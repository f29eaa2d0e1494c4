"""hidden-states-write-slots: the store and the connector's read on vLLM's own page-padded views.

The KV cache tensors are allocated and viewed by the model runner's own methods (on a runner
object given only the attributes those methods read), so the hidden-state layer shares its
memory with the other groups' layers exactly as on the GPU.
"""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import engine_config, needs
from upstream_worker import runner_views

from speculators_hybrid import planning
from speculators_hybrid.vllm_patches.connector import read_slots, slots_for
from speculators_hybrid.vllm_patches.spec import HiddenStatesCacheSpec

pytestmark = needs("hidden-states-own-group", "hidden-states-write-slots")

IDS = (2, 5, 8)  # 3 ids: the hidden page does not fill the shared page, so it is padded


@pytest.fixture
def tiny(shim):
    config = engine_config(preset="tiny", ids=IDS, prefix_caching=True, max_model_len=4096)
    kv = planning.plan(config, planning.layer_specs(config), 64 << 20)
    hidden = next(
        g for g in kv.kv_cache_groups if isinstance(g.kv_cache_spec, HiddenStatesCacheSpec)
    )
    return config, kv, hidden


def test_store_and_read_round_trip_through_the_padded_view(tiny):
    config, kv, hidden = tiny
    spec = hidden.kv_cache_spec
    assert spec.page_size_padded is not None  # the view really is strided
    raw, caches = runner_views(config, kv)
    name = hidden.layer_names[0]
    view = caches[name]
    assert view.shape[1:] == (spec.block_size, len(IDS), 256)
    assert not view.is_contiguous()

    before = raw[name].clone()
    tokens = 3 * spec.block_size + 5
    blocks = [7, 3, 11, 5]  # a request's blocks, out of order as the pool hands them out
    slots = slots_for(blocks, spec.block_size, tokens)
    padded = torch.cat([slots, torch.full((6,), -1)])  # CUDA-graph padding tokens
    values = torch.randn(tokens + 6, len(IDS), 256).to(spec.dtype)

    from vllm.model_executor.models.extract_hidden_states import CacheOnlyAttentionImpl

    writer = CacheOnlyAttentionImpl(len(IDS), 256, "auto", spec.dtype)
    writer.do_kv_cache_update(None, values, view, padded)

    assert torch.equal(read_slots(view, slots), values[:tokens])
    # Bytes outside the request's blocks and the null block 0 are untouched: padding slots
    # went to block 0, never to the last block of the cache; page padding is untouched.
    page = spec.page_size_bytes
    changed = (raw[name] != before).view(-1, page).any(dim=1).nonzero().flatten().tolist()
    assert set(changed) <= {0, *blocks}
    assert set(blocks) <= set(changed)
    real = spec.real_page_size_bytes
    assert torch.equal(raw[name].view(-1, page)[:, real:], before.view(-1, page)[:, real:])


def test_other_groups_layers_sharing_the_memory_keep_their_bytes(tiny):
    config, kv, hidden = tiny
    raw, caches = runner_views(config, kv)
    name = hidden.layer_names[0]
    sharing = [
        n for t in kv.kv_cache_tensors if name in t.shared_by for n in t.shared_by if n != name
    ]
    assert sharing  # the hidden layer shares a tensor with one layer of every other group
    other = sharing[0]
    page = hidden.kv_cache_spec.page_size_bytes
    mine, theirs = [2, 4], [3, 6]
    raw[other].view(-1, page)[theirs] = 5
    snapshot = copy.deepcopy(raw[other].view(-1, page)[theirs])
    view = caches[name]
    slots = slots_for(mine, hidden.kv_cache_spec.block_size, 2 * hidden.kv_cache_spec.block_size)
    from speculators_hybrid.vllm_patches.hidden_write import store

    store(torch.ones(len(slots), len(IDS), 256, dtype=view.dtype), view, slots)
    assert torch.equal(raw[other].view(-1, page)[theirs], snapshot)
    assert (raw[name].view(-1, page)[mine] != 0).any()


def test_stock_store_cannot_write_a_padded_view(tiny):
    """Why the patch exists: vLLM's own store assumes a contiguous cache."""
    from speculators_hybrid.plugin import PATCHER

    config, kv, hidden = tiny
    _, caches = runner_views(config, kv)
    PATCHER.revert()  # the `shim` fixture re-applies it afterwards
    from vllm.model_executor.models.extract_hidden_states import basic_cache

    view = caches[hidden.layer_names[0]]
    values = torch.ones(4, len(IDS), 256, dtype=view.dtype)
    with pytest.raises(RuntimeError, match="view"):
        basic_cache(values, view, torch.tensor([0, 1, 2, 3]))


def test_a_request_is_read_by_block_and_other_slots_by_row():
    """A request's slots fill its blocks from the first slot on: read a block at a time (one
    contiguous copy each), the same rows as reading slot by slot, page padding or not."""
    from speculators_hybrid.vllm_patches.connector import read_wide, whole_blocks

    page = torch.randn(12, 16 * 3 * 8 + 40)  # 40 values of page padding after each block
    padded = page[:, : 16 * 3 * 8].view(12, 16, 3, 8)
    plain = torch.randn(12, 16, 3, 8)
    slots = slots_for([7, 3, 11], 16, 2 * 16 + 5)
    assert whole_blocks(slots, 16).tolist() == [7, 3, 11]
    for cache in (padded, plain):
        by_row = torch.stack([cache[s // 16, s % 16] for s in slots.tolist()])
        assert torch.equal(read_slots(cache, slots), by_row)
        halves = [cache[..., :4], cache[..., 4:]]  # a wide group of W = 2
        assert torch.equal(read_wide(halves, slots), by_row)

    shuffled = slots[torch.randperm(len(slots), generator=torch.Generator().manual_seed(0))]
    later = slots_for([7, 3, 11], 16, 2 * 16 + 5)[3:]  # not from the first slot of a block
    for other in (shuffled, later):
        assert whole_blocks(other, 16) is None
        by_row = torch.stack([plain[s // 16, s % 16] for s in other.tolist()])
        assert torch.equal(read_slots(plain, other), by_row)
        assert torch.equal(read_wide([plain[..., :4], plain[..., 4:]], other), by_row)
