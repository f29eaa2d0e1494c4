"""vLLM's own KV-cache plan of a Qwen3.5-layout target with a speculators DFlash drafter beside it.

The runner reports every attention layer of the engine, the drafter's included (vLLM 0.20.1
`gpu_model_runner.py` `get_kv_cache_spec` walks all `AttentionLayerBase` layers; the DFlash
proposer takes the layers that are not the target's as its own and asserts they share one KV-cache
group). A DFlash draft layer is vLLM's `Attention` with the drafter config's KV heads and head
size: a `FullAttentionSpec` at the engine's block size before 0.25.0, a `SlidingWindowSpec` with
its own 16-token block from 0.25.0 (`qwen3_dflash._resolve_layer_attention`). vLLM has raised the
attention block so that one attention page holds one GDN state page, and pads the state page to
it; `unify_kv_cache_spec_page_size` then needs every other page to divide the largest, and a state
page can never grow. So the plan holds when a draft layer's bytes per token divide the target's.

speculators 0.9.0 (`train/cli.py` `create_transformer_layer_config`) copies the verifier's
`num_key_value_heads` and `head_dim` into the drafter (for Qwen3.6-27B: 20 query heads, as 5,120
is not a multiple of 24 x 256; 4 KV heads of 256), so its layers cost the target's 4,096 B a token.
With speculators' DFlash defaults (5 layers, block 16: 15 speculative tokens, 2,048-token sliding
window) the GDN conv state holds 3 + 15 steps: (3,145,728 + 18 x 10,240 x 2) B = 3,514,368 B,
an 864-token attention block and a 3,538,944 B page for every layer, target and drafter.
A drafter with more KV bytes a token than the target (8 KV heads of 256) fails that planning on
vLLM < 0.25.0 (`AssertionError`: the state page would not grow), one whose share does not divide
it (3 of 256) on vLLM < 0.24.0 (`NotImplementedError` "not divisible by the maximum page size";
0.24.0 pads that page, as the GPU runner marks FlashAttention's specs as read by block stride),
as the public reports of Qwen3.5 with a DFlash drafter on 0.20.x describe. From 0.25.0: the sliding
draft layers pick their own block (16 tokens in 0.25-0.28, 32 in 0.29) that divides the page; from
0.30.0 they take the engine's block and vLLM pads the smaller pages instead (the 8-head drafter
then doubles every page, GDN state included: 7,077,888 B).
The tiny target's attention block is 80 tokens to 0.31 and 96 from 0.32.0 (vLLM aligns it to 32).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import scratch
from packaging.version import Version

from speculators_hybrid import planning
from speculators_hybrid.models import drafter_config, write_config
from speculators_hybrid.registry import base_version
from speculators_hybrid.versions import installed

RELEASE = Version(str(base_version(installed("vllm") or "0")))
SLIDING = RELEASE >= Version("0.25.0")  # DFlash draft layers with their own sliding window
PADS = RELEASE >= Version("0.30.0")  # draft layers at the engine's block, smaller pages padded
MAX_LEN = 4096  # the tiny preset's max_position_embeddings


def drafter(target: Path, layers: int, block: int, kv_heads: int = 0, heads: int = 0) -> Path:
    """A folder with speculators 0.9.0's DFlash config.json for `target` (`kv_heads`, `heads`:
    another drafter's, for the shapes that fail)."""
    folder = scratch("drafter-")
    config = drafter_config(target, layers=layers, block=block, kv_heads=kv_heads, heads=heads)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def specs_of(preset: str, layers: int, block: int, **dims: int):
    """(config, every layer's spec as one GPU worker reports it) for target + drafter."""
    target = write_config(scratch("target-") / preset, preset)
    model = str(drafter(target, layers, block, **dims))
    spec = {"method": "dflash", "model": model, "num_speculative_tokens": block - 1}
    setup = planning.Setup(
        model=str(target), layer_ids=None, max_model_len=MAX_LEN, speculative=json.dumps(spec)
    )
    config = planning.engine_config(setup)
    return config, planning.layer_specs(config)


def split(config, specs):
    first = config.model_config.get_num_layers(config.parallel_config)
    draft = {n: s for n, s in specs.items() if int(n.split(".")[2]) >= first}
    state = [s for s in specs.values() if type(s).__name__ == "MambaSpec"]
    attention = [s for n, s in specs.items() if n not in draft and s not in state]
    return draft, state, attention


# preset, draft layers, DFlash block (speculators' default for 27B; tests/gpu's for tiny),
# attention block, page of every layer (the drafter's before unification where SLIDING)
CASES = [
    ("qwen3.6-27b", 5, 16, 864, 3_538_944),
    # (4 x 64 x 64 + 6 x 512 channels) x 2 B = 38,912 B; 512 B a token
    ("tiny", 2, 4, 80, 40_960) if RELEASE < Version("0.32.0") else ("tiny", 2, 4, 96, 49_152),
]


@pytest.fixture(params=[True, False], ids=["plugin", "stock"])
def patched(request) -> Iterator[bool]:
    """Planned with the plugin's vLLM patches applied (as an engine with the plugin) or none."""
    planning.patches(request.param)
    yield request.param
    planning.patches(True)


@pytest.mark.parametrize(("preset", "layers", "block", "attention_block", "page"), CASES)
def test_speculators_drafter_plans_beside_the_target(
    preset, layers, block, attention_block, page, patched
):
    config, specs = specs_of(preset, layers, block)
    draft, state, attention = split(config, specs)
    assert len(draft) == layers and len(state) == 3 * len(attention)
    assert {s.block_size for s in attention} == {attention_block}
    assert {s.page_size_bytes for s in state + attention} == {page}
    kinds = {type(s).__name__ for s in draft.values()}
    assert kinds == {"SlidingWindowSpec" if SLIDING else "FullAttentionSpec"}
    per_token = {s.page_size_bytes // s.block_size for s in draft.values()}
    assert per_token == {page // attention_block}  # the target's bytes a token
    kv = planning.plan(config, specs, 1 << 40)
    groups = [g for g in kv.kv_cache_groups if set(g.layer_names) & set(draft)]
    assert len(groups) == 1 and set(draft) <= set(groups[0].layer_names)  # vLLM asserts it
    assert {g.kv_cache_spec.page_size_bytes for g in kv.kv_cache_groups} == {page}


@pytest.mark.parametrize(
    ("kv_heads", "draft_page", "error", "plans_from"),
    [
        # 2 x the target's page: the GDN state page cannot grow (vLLM pads it from 0.26.0)
        (8, 7_077_888, AssertionError, "0.25.0"),
        # 3/4 of it: does not divide (0.24.0 pads it: FlashAttention reads pages by stride)
        (3, 2_654_208, NotImplementedError, "0.24.0"),
    ],
    ids=["8-kv-heads", "3-kv-heads"],
)
def test_a_drafter_of_other_kv_dims_fails_on_older_releases(
    kv_heads, draft_page, error, plans_from, patched
):
    config, specs = specs_of("qwen3.6-27b", 5, 16, kv_heads=kv_heads, heads=24)
    draft, _, _ = split(config, specs)
    per_token = {s.page_size_bytes // s.block_size for s in draft.values()}
    assert per_token == {kv_heads * 256 * 2 * 2}
    if not SLIDING:
        assert {s.page_size_bytes for s in draft.values()} == {draft_page}
    if RELEASE < Version(plans_from):
        with pytest.raises(error):
            planning.plan(config, specs, 1 << 40)
        return
    kv = planning.plan(config, specs, 1 << 40)
    page = max(draft_page, 3_538_944) if PADS else 3_538_944
    assert {g.kv_cache_spec.page_size_bytes for g in kv.kv_cache_groups} == {page}
