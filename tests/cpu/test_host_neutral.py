"""Planning answers what a CUDA start does, whatever CPU it runs on (speculators_hybrid.cpu).

vLLM's CPU platform asks the host for its CPU features while it builds a config (AMX on 0.22+,
AVX-512 BF16 on 0.29+) and then changes prefix caching, chunked prefill, the SSM state dtype
or the conv state layout. Here the host's answers are forced both ways (a property of the
host, not vLLM code we patch): the plans must be the same, and without our planning platform
they differ on every release that has such a branch.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from conftest import IDS, LAYOUT, NO_CHUNKED_PREFILL, host_answers, model_dir

from speculators_hybrid import planning


@contextmanager
def platform(stock: bool) -> Iterator[None]:
    """vLLM's own CpuPlatform (stock) or ours for the duration. Stock reads Triton as present
    while it builds a config, as ours does: vLLM 0.34's refuses an x86 host without triton-cpu
    there, on every host alike."""
    import vllm.platforms as platforms
    from vllm.platforms.cpu import CpuPlatform

    from speculators_hybrid.cpu import with_triton

    class StockPlatform(CpuPlatform):
        @classmethod
        def check_and_update_config(cls, vllm_config) -> None:
            with with_triton():
                super().check_and_update_config(vllm_config)

    mp = pytest.MonkeyPatch()
    if stock:
        ours, theirs = platforms._current_platform, StockPlatform()
        mp.setattr(platforms, "_current_platform", theirs)
        # and where a vLLM module bound the platform at import (vllm.config.vllm calls
        # check_and_update_config through that name)
        for module in list(sys.modules.values()):
            if getattr(module, "__dict__", {}).get("current_platform") is ours:
                mp.setattr(module, "current_platform", theirs)
    try:
        yield
    finally:
        mp.undo()


def facts(prefix_caching: bool, layer_ids=IDS) -> dict:
    """What a plan is made of, or the error vLLM raised while making it."""
    setup = planning.Setup(
        model=model_dir("qwen3.6-27b"),
        layer_ids=layer_ids,
        prefix_caching=prefix_caching,
        max_model_len=8192,
        # vLLM 0.22.x's connector refuses chunked prefill; plain prefill keeps vLLM's default
        chunked_prefill=False if NO_CHUNKED_PREFILL and layer_ids else None,
    )
    try:
        config = planning.engine_config(setup)
        specs = planning.layer_specs(config)
        kv = planning.plan(config, specs, 32 << 30)
    except Exception as exc:  # the AMX host's start-up error on stock 0.24.0
        return {"error": f"{type(exc).__name__}: {exc}"}
    cache, sched = config.cache_config, config.scheduler_config
    return {
        "prefix_caching": cache.enable_prefix_caching,
        "chunked_prefill": sched.enable_chunked_prefill,
        "mamba_cache_mode": getattr(cache, "mamba_cache_mode", None),
        "ssm_dtype": cache.mamba_ssm_cache_dtype,
        "conv_layout": os.environ.get(LAYOUT),
        "specs": specs,
        "groups": kv.kv_cache_groups,
        "num_blocks": kv.num_blocks,
    }


def both_hosts(stock: bool, **kwargs) -> tuple[dict, dict]:
    out = []
    for answer in (True, False):
        with host_answers(answer), platform(stock):
            out.append(facts(**kwargs))
    return out[0], out[1]


@pytest.mark.parametrize("prefix_caching", [False, True], ids=["prefix-off", "prefix-on"])
@pytest.mark.parametrize("ids", [IDS, None], ids=["extraction", "plain"])
def test_plan_is_the_same_on_every_host(shim, prefix_caching, ids):
    featured, plain = both_hosts(stock=False, prefix_caching=prefix_caching, layer_ids=ids)
    assert "error" not in plain, plain
    assert featured == plain
    assert plain["conv_layout"] is None


def _has_host_branch() -> bool:
    """Whether this vLLM's CPU platform plans differently when the host has the features."""
    import inspect

    import vllm.platforms.cpu as cpu_platform

    source = inspect.getsource(cpu_platform.CpuPlatform.check_and_update_config)
    return "torch.cpu._is_" in source


@pytest.mark.skipif(not _has_host_branch(), reason="this vLLM's CPU platform asks no CPU feature")
def test_stock_cpu_platform_plans_by_the_host(shim):
    """The branch is real on this release: vLLM's CpuPlatform alone gives two plans."""
    featured, plain = both_hosts(stock=True, prefix_caching=True, layer_ids=None)
    assert featured != plain
