"""dflash-drafter-text-rope: a speculators DFlash drafter of a Qwen3.5 target gets 1-D RoPE.

The drafter folders hold a config.json in the shape speculators 0.9.0 saves for the tiny
Qwen3.5 target (`create_transformer_layer_config`: `mrope_section` rescaled to the full head,
`partial_rotary_factor` 1.0, `mrope_interleaved` dropped). vLLM's own `SpeculativeConfig` builds
the draft `ModelConfig` from it, as `LLM(..., speculative_config=...)` does; the V1 proposer's
own `_raise_if_mrope` is what stock vLLM stops at when the engine starts.
"""

from __future__ import annotations

import json
from functools import cache
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import model_dir, needs, scratch

from speculators_hybrid.models import drafter_config
from speculators_hybrid.vllm_patches import dflash_rope
from speculators_hybrid.vllm_patches._targets import DFLASH_TYPES

fixed = needs(dflash_rope.PATCH.id)


@cache
def drafter_dir(algorithm: str) -> str:
    folder = scratch(f"{algorithm}-drafter-")
    config = drafter_config(model_dir("tiny"), algorithm, layer_types=["full_attention"])
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def speculative_config(algorithm: str) -> Any:
    """vLLM's SpeculativeConfig for the tiny Qwen3.5 target and a speculators drafter."""
    from vllm.config import ModelConfig, ParallelConfig, SpeculativeConfig

    target = ModelConfig(model=model_dir("tiny"), skip_tokenizer_init=True)
    method = "dflash" if algorithm.startswith("dflash") else algorithm
    return SpeculativeConfig(
        target_model_config=target,
        target_parallel_config=ParallelConfig(),
        model=drafter_dir(algorithm),
        method=method,
        num_speculative_tokens=3,
    )


def proposer_refuses(spec: Any) -> bool:
    """Whether vLLM's V1 proposer refuses this drafter at engine start (parallel drafting)."""
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    if not spec.parallel_drafting:
        return False
    try:
        SpecDecodeBaseProposer._raise_if_mrope(
            SimpleNamespace(draft_model_config=spec.draft_model_config)
        )
    except NotImplementedError as exc:
        assert "M-RoPE" in str(exc)
        return True
    return False


def dflash_types() -> list[str]:
    from vllm.transformers_utils.configs.speculators.algos import SUPPORTED_SPECULATORS_TYPES

    return [t for t in DFLASH_TYPES if t in SUPPORTED_SPECULATORS_TYPES]


@fixed
def test_stock_vllm_refuses_the_drafter(no_shim):
    spec = speculative_config("dflash")
    assert spec.target_model_config.uses_mrope
    assert spec.draft_model_config.uses_mrope
    assert proposer_refuses(spec)


@fixed
@pytest.mark.parametrize("algorithm", DFLASH_TYPES)
def test_dflash_drafter_runs_with_text_rope(algorithm, shim):
    if algorithm not in dflash_types():
        pytest.skip(f"this vLLM has no speculators type {algorithm!r}")
    spec = speculative_config(algorithm)
    draft = spec.draft_model_config
    assert spec.method == "dflash" and spec.parallel_drafting
    assert not draft.uses_mrope
    assert not proposer_refuses(spec)
    rope = draft.hf_config.rope_parameters
    assert rope["rope_theta"] == 10000000.0 and rope.get("partial_rotary_factor", 1.0) == 1.0
    assert not set(dflash_rope.MROPE_FIELDS) & set(rope)
    # the target's config is its own object and keeps M-RoPE
    assert spec.target_model_config.uses_mrope
    assert "mrope_section" in spec.target_model_config.hf_text_config.rope_parameters


def test_eagle3_drafter_keeps_its_rope(shim):
    spec = speculative_config("eagle3")
    assert spec.draft_model_config.uses_mrope
    assert spec.draft_model_config.hf_config.rope_parameters["mrope_section"] == [12, 12, 8]


def test_drop_mrope_reads_both_rope_keys():
    config = {
        "rope_scaling": {"rope_type": "default", "mrope_section": [1], "mrope_interleaved": True},
        "rope_parameters": {"rope_type": "default", "rope_theta": 1.0},
    }
    assert dflash_rope.drop_mrope(config) == ["rope_scaling"]
    assert config == {
        "rope_scaling": {"rope_type": "default"},
        "rope_parameters": {"rope_type": "default", "rope_theta": 1.0},
    }
