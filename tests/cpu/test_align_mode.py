"""Mamba align mode's start-up constraint (issue 17, item 3), found before vLLM starts.

vLLM's own config code plans the engine block (the Qwen3.6-27B preset with the patches, as a GPU
start-up would) and vLLM's own `VllmConfig.validate_block_size` is the judge: on 0.20-0.26 it
refuses max_num_batched_tokens 256 with the engine block (800 tokens here; 416 for the bf16-state
look-alike an H200 run hit), and accepts the smallest value `align_mode` names; from 0.27 it
accepts both.
"""

from __future__ import annotations

import pytest
import vllm
from conftest import NO_CHUNKED_PREFILL, model_dir

from speculators_hybrid import align_mode, planning


def _setup(batched: int) -> planning.Setup:
    return planning.Setup(
        model=model_dir("qwen3.6-27b"),
        prefix_caching=True,
        max_model_len=8192,
        max_num_batched_tokens=batched,
    )


@pytest.mark.skipif(
    NO_CHUNKED_PREFILL,
    reason="vLLM 0.22-0.23: the CPU tests plan them without chunked prefill, as their stock "
    "connector must run, so prefix caching (and align mode) is off (test_prefix_caching_kept.py)",
)
@pytest.mark.shim_only  # align_mode plans with the runtime patches, as launch runs it
def test_align_mode_block_above_the_batch_is_refused_with_the_smallest_valid_value(
    shim,
):
    config = planning.engine_config(_setup(256))
    specs = planning.layer_specs(config)
    kv = planning.plan(config, specs, align_mode.PLAN_MEMORY)
    result = align_mode.check_config(config, kv)
    assert result.mamba_cache_mode == "align"
    # The model's own engine block (attention sized to the GDN state), not the hidden group's.
    attention = {s.block_size for n, s in specs.items() if n.endswith("self_attn.attn")}
    assert [result.block_size] == list(attention)
    assert result.block_size > 256
    if not align_mode.constrained(vllm.__version__):
        assert result.ok, result.error  # vLLM >= 0.27 dropped the assertion
        return
    assert not result.ok
    assert f"block_size ({result.block_size}) must be <= max_num_batched_tokens (256)" in (
        result.error
    )
    assert result.smallest_valid == result.block_size
    assert f"--max-num-batched-tokens {result.block_size}" in result.message()
    # vLLM itself accepts the value named, and nothing smaller.
    config.scheduler_config.max_num_batched_tokens = result.smallest_valid
    config.validate_block_size()
    config.scheduler_config.max_num_batched_tokens = result.smallest_valid - 1
    try:
        config.validate_block_size()
    except AssertionError:
        pass
    else:
        raise AssertionError("vLLM accepted a batch below the engine block")


@pytest.mark.shim_only
@pytest.mark.full_tier  # a child Python plans with vLLM again (about a minute)
def test_launch_raises_a_launcher_value_below_the_engine_block():
    from speculators_hybrid.launcher.adjust import align_mode_batch
    from speculators_hybrid.launcher.target import load

    version = vllm.__version__
    if not align_mode.constrained(version) or NO_CHUNKED_PREFILL:
        pytest.skip("no align-mode refusal with the plugin on this vLLM")
    spec = '{"draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": [2, 32]}}}'
    argv = ["vllm", "serve", "m", "--speculative-config", spec, "--max-model-len", "8192"]
    logs: list[str] = []
    out = align_mode_batch(
        [*argv, "--max-num-batched-tokens", "256"],
        [],
        version,
        load(model_dir("qwen3.6-27b")),
        True,
        logs.append,
    )
    assert out[:-1] == [*argv, "--max-num-batched-tokens"]
    assert int(out[-1]) > 256, logs
    assert len(logs) == 1 and f"to {out[-1]}" in logs[0]
