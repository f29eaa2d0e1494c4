"""vLLM's plan of the `qwen3.6-27b` preset against the published Qwen3.6-27B config's facts.

The published config keeps the Gated DeltaNet state in float32 (`mamba_ssm_dtype`), so one GDN
layer's state is, by hand from its fields (tests/unit/test_models.py checks the preset has them):
- the recurrent state: 48 value heads x 128 x 128 x 4 B = 3,145,728 B;
- the conv state: (kernel 4 - 1 + 1 speculative token, as extraction runs vLLM's speculative
  decoding with one token) x 10,240 channels (q and k: 16 heads of 128 each, v: 48 of 128)
  x 2 B (bf16) = 81,920 B (61,440 without extraction);
- vLLM pads it to whole 16-token blocks of an attention layer (4 KV heads x 256 x K and V x
  2 B = 4,096 B a token): an 800-token block, 3,276,800 B a layer (784 and 3,211,264 B without
  extraction); 157,286,400 B (157 MB) a request for the 48 layers.
In bf16 (the look-alike the dated GPU results ran, `qwen3.6-27b-bf16-state`) the recurrent state
is half: a 416-token block, 1,703,936 B a layer, 82 MB a request.

KV tokens at 8,192 tokens and 20 GiB, as `doctor --max-model-len 8192 --memory 20` gives them,
follow from those pages where the hidden states sit in one group as wide as the model's
(`hidden-states-wide-group`: vLLM 0.20-0.21, prefix caching off; 16 layers a group): the pool
has 20 GiB // (16 x page) blocks, and one request takes per group of 16 layers 1 state block
(+1 spare for speculation, except prefill-only as `launch` runs it), ceil(8,192 / block)
attention blocks and ceil(8,192 / hidden block) hidden-state blocks (16 pages of 4 ids x 5,120
x 2 B a token); vLLM's capacity is blocks / (blocks a request) x 8,192. Pinned as vLLM 0.20.1
computes them (2026-12-06): 244,004 plain, 139,605 with extraction, 159,548 as `launch` runs it
(the look-alike: 279,552 / 165,310 / 179,086, the first two as the H200 logs of 2026-12-01
gave them).
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import IDS, NO_CHUNKED_PREFILL, model_dir

from speculators_hybrid import doctor, planning
from speculators_hybrid.plugin import PATCHER

ALIGN = 16  # vLLM's kernel block alignment for the attention block
ATTENTION_TOKEN = 4 * 256 * 2 * 2  # an attention layer's bytes a token: KV heads x dim x K,V x 2 B
CONV_CHANNELS = 2 * 16 * 128 + 48 * 128
HIDDEN_TOKEN = len(IDS) * 5120 * 2  # 40,960 B of hidden states a token
LENGTH, MEMORY_GIB = 8192, 20
STATE_BYTES = {"qwen3.6-27b": 4, "qwen3.6-27b-bf16-state": 2}  # the recurrent state's dtype size


def state_page(preset: str, extraction: bool) -> tuple[int, int]:
    """(attention block tokens, page bytes) of a GDN layer, by hand from the published fields."""
    state = 48 * 128 * 128 * STATE_BYTES[preset] + (4 - 1 + extraction) * CONV_CHANNELS * 2
    block = ALIGN * math.ceil(state / (ALIGN * ATTENTION_TOKEN))
    return block, block * ATTENTION_TOKEN


def kv_tokens(preset: str, extraction: bool, spare: bool) -> int:
    """vLLM's capacity with the hidden states in one 16-wide group (prefix caching off)."""
    block, page = state_page(preset, extraction)
    blocks = (MEMORY_GIB << 30) // (16 * page)
    per_request = 3 * (1 + spare) + math.ceil(LENGTH / block)
    if extraction:
        per_request += math.ceil(LENGTH / (page * 16 // HIDDEN_TOKEN))
    return int(blocks / per_request * LENGTH)


@pytest.mark.parametrize(
    ("preset", "block", "page", "dtype"),
    [
        ("qwen3.6-27b", 800, 3_276_800, torch.float32),
        ("qwen3.6-27b-bf16-state", 416, 1_703_936, torch.bfloat16),
    ],
)
def test_the_gdn_state_is_planned_as_the_published_config_says(shim, preset, block, page, dtype):
    assert state_page(preset, True) == (block, page)
    setup = planning.Setup(
        model=model_dir(preset),
        layer_ids=IDS,
        max_model_len=LENGTH,
        chunked_prefill=False if NO_CHUNKED_PREFILL else None,
    )
    config = planning.engine_config(setup)
    specs = planning.layer_specs(config)
    states = [s for s in specs.values() if type(s).__name__ == "MambaSpec"]
    attention = {s.block_size for n, s in specs.items() if n.endswith("self_attn.attn")}
    assert len(states) == 48 and attention == {block}
    assert {s.page_size_bytes for s in states} == {page}
    assert {s.dtypes[-1] for s in states} == {dtype}  # the recurrent state; conv: the model's
    assert 48 * page == {"qwen3.6-27b": 157_286_400, "qwen3.6-27b-bf16-state": 81_788_928}[preset]


@pytest.mark.full_tier  # doctor plans the 27B config four times per preset
@pytest.mark.parametrize(
    ("preset", "plain", "extraction", "prefill_only"),
    [
        ("qwen3.6-27b", 244_004, 139_605, 159_548),
        ("qwen3.6-27b-bf16-state", 279_552, 165_310, 179_086),
    ],
)
def test_doctor_kv_tokens_at_8192_tokens_and_20_gib(shim, preset, plain, extraction, prefill_only):
    out = doctor.report(model_dir(preset), IDS, 1, LENGTH, MEMORY_GIB, False)
    plans = {p["name"]: p for p in out["plans"]}
    assert plans["no-extraction"]["capacity_tokens"] == plain == kv_tokens(preset, False, False)
    if "hidden-states-wide-group" not in plans["shim"]["patches"]:
        pytest.skip(
            f"vLLM {PATCHER.version_of('vllm')}: one-layer hidden groups, not the layout pinned"
        )
    assert plans["shim"]["capacity_tokens"] == extraction == kv_tokens(preset, True, True)
    lean = out["prefill_only"]["capacity_tokens"]
    assert lean == prefill_only == kv_tokens(preset, True, False)
