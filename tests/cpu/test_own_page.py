"""hidden-states-own-page-size: the hidden states are billed, allocated and scheduled at their
own bytes, by vLLM's own planner, allocator layout and scheduler (every vLLM release)."""

from __future__ import annotations

import pytest
from conftest import (
    IDS,
    NO_CHUNKED_PREFILL,
    PATCHER,
    engine_config,
    engine_scheduler,
    model_output,
    needs,
    vllm_patches,
)

from speculators_hybrid import planning
from speculators_hybrid.vllm_patches.own_page import is_hidden

pytestmark = needs("hidden-states-own-page-size")

LONG = 262144
HIDDEN_BYTES = LONG * len(IDS) * 5120 * 2  # 4 ids x hidden 5120 x bf16, per token


def _request_bytes(preset: str = "qwen3.6-27b", **kw) -> tuple[int, object, object]:
    config = engine_config(preset=preset, **kw)
    kv = planning.plan(config, planning.layer_specs(config), 1 << 40)
    return planning.max_request_bytes(config, kv), config, kv


def _caching_cases() -> list[bool]:
    # vLLM 0.22-0.23 without chunked prefill (as planned here) run it with prefix caching off.
    selected = {p.id for p in PATCHER.select(vllm_patches())}
    return [False] if "no-prefix-caching-for-hybrid-extraction" in selected else [False, True]


@pytest.mark.parametrize("prefix_caching", _caching_cases(), ids=lambda c: f"prefix-{c}")
@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_a_long_request_costs_its_own_bytes(shim, tp, prefix_caching):
    """Issue target: <= 1.05 x (KV without extraction + the hidden states' bytes), 262k tokens."""
    plain, _, _ = _request_bytes(ids=None, tp=tp, prefix_caching=prefix_caching)
    ours, config, kv = _request_bytes(tp=tp, prefix_caching=prefix_caching)
    ratio = ours / (plain + HIDDEN_BYTES)
    print(f"tp {tp} prefix {prefix_caching}: {ours / 2**30:.1f} GiB, {ratio:.3f}x target")
    # With prefix caching the hidden block must divide the engine block (cache hits keep the
    # model's granularity): on 0.20.1, 32 of the 41 tokens that fit a page at TP 1 (1.12x),
    # up to 1.22x at TP 4/8. Without it (every vLLM >= 0.22 here) as many as fit: <= 1.03x.
    assert ratio <= (1.25 if prefix_caching else 1.05)
    assert ours >= plain + HIDDEN_BYTES * 0.99  # the hidden states are billed, not dropped
    assert all(len(g.layer_names) == 1 for g in kv.kv_cache_groups)


def test_stock_vllm_bills_the_hidden_group_at_the_widest_groups_width(no_shim):
    plain, _, _ = _request_bytes(ids=None)
    try:
        stock, _, _ = _request_bytes()
    except (ValueError, NotImplementedError):
        pytest.skip("this vLLM cannot plan hybrid extraction without us (see the own-group test)")
    assert stock > 5 * (plain + HIDDEN_BYTES)  # 6.7x measured with 0.25.0's planner


@pytest.mark.parametrize("tp", [1, 4])
def test_what_is_allocated_is_what_is_planned(shim, tp):
    _, config, kv = _request_bytes(tp=tp)
    page = kv.kv_cache_groups[0].kv_cache_spec.page_size_bytes
    layers = [n for g in kv.kv_cache_groups for n in g.layer_names]
    # One page-wide pool: tensors of one page per block id, each layer placed exactly once
    # (`shared_by` before vLLM 0.33, `layers` from 0.33).
    placed = [n for t in kv.kv_cache_tensors for n in getattr(t, "shared_by", None) or t.layers]
    assert sorted(placed) == sorted(layers)
    assert all(t.size == kv.num_blocks * page for t in kv.kv_cache_tensors)
    # Before 0.33 each tensor is an allocation; from 0.33 they alias one backing.
    sizes = [t.size for t in kv.kv_cache_tensors]
    assert (max(sizes) if hasattr(kv.kv_cache_tensors[0], "layers") else sum(sizes)) <= 1 << 40
    (hidden,) = [g for g in kv.kv_cache_groups if is_hidden(g.kv_cache_spec)]
    spec = hidden.kv_cache_spec
    per_token = len(IDS) * 5120 * 2
    assert spec.page_size_bytes == page and spec.block_size * per_token <= page
    assert (spec.block_size + 1) * per_token > page  # as many tokens as fit (caching off)


@pytest.mark.skipif(NO_CHUNKED_PREFILL, reason="vLLM 0.22-0.23: scheduler built without chunking")
def test_scheduler_never_hands_out_more_than_the_pool(shim):
    """The real scheduler runs more prompts than the pool holds at once: every
    block id it hands out, in every group, is distinct and inside the allocation, the hidden
    group covers every computed token, and requests still finish."""
    config = engine_config(max_model_len=8192)
    sched = config.scheduler_config
    sched.max_num_batched_tokens = 16384  # several prompts per step: they must share the pool
    if getattr(sched, "max_num_scheduled_tokens", None) is not None:
        sched.max_num_scheduled_tokens = 16384
    specs = planning.layer_specs(config)
    one_request = planning.max_request_bytes(config, planning.plan(config, specs, 1 << 40))
    kv = planning.plan(config, specs, int(1.5 * one_request))
    scheduler, request = engine_scheduler(config, kv)
    prompts = {f"r{i}": [1 + (i + j) % 500 for j in range(2000)] for i in range(12)}
    for req_id, prompt in prompts.items():
        scheduler.add_request(request(req_id, prompt))
    hidden = next(i for i, g in enumerate(kv.kv_cache_groups) if is_hidden(g.kv_cache_spec))
    block = kv.kv_cache_groups[hidden].kv_cache_spec.block_size
    most_used, finished, last = 0, set(), set()
    for _ in range(60):
        out = scheduler.schedule()
        used: list[int] = []
        for req_id, req in scheduler.requests.items():
            blocks = scheduler.kv_cache_manager.get_block_ids(req_id)
            used += [b for group in blocks for b in group]
            if any(blocks):  # schedule() has already counted this step's tokens as computed
                assert len(blocks[hidden]) * block >= req.num_computed_tokens
        assert len(used) == len(set(used))
        assert all(0 < b < kv.num_blocks for b in used)  # 0 is the null block
        most_used = max(most_used, len(used))
        done = dict.fromkeys(planning.prompts_done(scheduler, out), 7)
        # A connector that delays freeing (vLLM >= 0.22) hears "saved" for last step's finishers.
        saved = frozenset(r for r in last if r in scheduler.requests)
        scheduler.update_from_output(out, model_output(out, done, saved))
        finished |= set(done)
        last = set(done)
    assert most_used > 0.7 * kv.num_blocks, "the pool never filled up; the test proves nothing"
    assert finished == set(prompts)


def test_tiny_hybrid_capacity_is_what_its_true_bytes_allow(shim):
    """The GPU target, on the CPU: KV capacity (tokens, as vLLM logs it) for the tiny hybrid
    with extraction >= 0.95 x what KV without extraction + the hidden bytes allow."""
    from vllm.v1.core.kv_cache_utils import get_max_concurrency_for_kv_cache_config

    memory = 4 << 30

    def capacity(ids):
        config = engine_config(preset="tiny", ids=ids, max_model_len=4096)
        kv = planning.plan(config, planning.layer_specs(config), memory)
        tokens = get_max_concurrency_for_kv_cache_config(config, kv) * 4096
        return tokens, planning.max_request_bytes(config, kv)

    tiny_ids = (1, 4, 5, 8)
    plain_tokens, plain_request = capacity(None)
    ours, _ = capacity(tiny_ids)
    hidden_request = 4096 * len(tiny_ids) * 256 * 2
    true_tokens = plain_tokens * plain_request / (plain_request + hidden_request)
    assert ours >= 0.95 * true_tokens
