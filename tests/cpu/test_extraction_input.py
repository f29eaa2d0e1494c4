"""check-extraction-input: vLLM's own EngineArgs -> VllmConfig refuses bad extraction input while
it builds the config, naming the ids or the model class and saying what to do."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import NO_CHUNKED_PREFILL, PATCHED_VLLM, PATCHER, VLLM, model_dir, needs
from packaging.version import Version

from speculators_hybrid import planning
from speculators_hybrid.models import config_dict

pytestmark = needs("check-extraction-input")

# The runtime form says who refused; vLLM's own source (patches/vllm) does not.
PREFIX = "" if PATCHED_VLLM else "speculators-hybrid: "
# Small non-Qwen3.5 targets, as config.json alone (no weights are read on this path).
GPT2 = {
    "architectures": ["GPT2LMHeadModel"],
    "model_type": "gpt2",
    "n_layer": 2,
    "n_embd": 64,
    "n_head": 2,
    "vocab_size": 128,
    "n_positions": 1024,
}
QWEN3_NEXT = {
    "architectures": ["Qwen3NextForCausalLM"],
    "model_type": "qwen3_next",
    "num_hidden_layers": 4,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    "hidden_size": 128,
    "intermediate_size": 256,
    "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 64,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 2,
    "linear_key_head_dim": 32,
    "linear_value_head_dim": 32,
    "vocab_size": 256,
    "max_position_embeddings": 4096,
    "dtype": "bfloat16",
}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    four = config_dict("tiny", multimodal=True)  # Qwen3.5 with vision, 4 text layers
    four["text_config"]["num_hidden_layers"] = 4
    four["text_config"]["layer_types"] = four["text_config"]["layer_types"][:4]
    out = {}
    for name, config in (("qwen3_5-4", four), ("gpt2", GPT2), ("qwen3_next", QWEN3_NEXT)):
        folder = Path(tmp_path_factory.mktemp(name))
        (folder / "config.json").write_text(json.dumps(config))
        out[name] = str(folder)
    return out


def build(model: str, ids: tuple | None, **extra):
    setup = planning.Setup(
        model=model,
        layer_ids=ids,
        max_model_len=1024,
        chunked_prefill=False if NO_CHUNKED_PREFILL else None,
        **extra,
    )
    return planning.engine_config(setup)


def with_speculative_config(speculative_config: dict):
    """A config for the 8-layer Qwen3.5 with this speculative_config and no KV connector."""
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(
        model=model_dir("tiny"),
        skip_tokenizer_init=True,
        max_model_len=1024,
        speculative_config=speculative_config,
    )
    return args.create_engine_config()


def refused(model: str, ids: tuple) -> str:
    with pytest.raises(ValueError) as err:  # pydantic's ValidationError is a ValueError
        build(model, ids)
    return str(err.value)


def test_speculators_default_for_4_layers_is_refused_with_advice(shim, models):
    message = refused(models["qwen3_5-4"], (2, 2, 1, 4))
    assert f"{PREFIX}layer ids [2, 2, 1, 4] do not fit" in message
    assert "(n = 4 decoder layers, from text_config): duplicated [2]." in message
    assert "These are speculators' default [2, n//2, n-3, n], which do not fit n = 4" in message
    assert "--target-layer-ids 1 2 3 4" in message
    assert "hf_config.eagle_aux_hidden_state_layer_ids with `vllm serve`" in message


def test_without_the_patch_vllm_takes_them_and_fails_later(no_shim, models):
    # vLLM 0.25.0 then fails in `propose`: "The expanded size of the tensor (4) must match
    # the existing size (3)" (layer 2 is collected once for two ids).
    config = build(models["qwen3_5-4"], (2, 2, 1, 4))
    hf_config = config.speculative_config.draft_model_config.hf_config
    assert list(hf_config.eagle_aux_hidden_state_layer_ids) == [2, 2, 1, 4]


@pytest.mark.parametrize(
    ("ids", "problem"),
    [
        ((3, 9), "outside [0, 8]: [9]"),
        ((-1, 4, 8), "outside [0, 8]: [-1]"),
        ((1, 4, 4, 8), "duplicated [4]"),
        ((2, 2, 9), "duplicated [2]; outside [0, 8]: [9]"),
    ],
)
def test_ids_outside_the_model_or_repeated_are_refused(shim, ids, problem):
    message = refused(model_dir("tiny"), ids)
    assert f"layer ids {list(ids)} do not fit" in message and problem in message


def test_extraction_without_ids_is_refused(shim):
    with pytest.raises(ValueError, match="extract_hidden_states needs layer ids"):
        with_speculative_config({"method": "extract_hidden_states", "num_speculative_tokens": 1})


@pytest.mark.parametrize(
    ("preset", "ids"),
    [("tiny", (0, 4, 8)), ("tiny", (8, 1)), ("qwen3.6-27b", (2, 32, 61, 64))],
)
def test_distinct_ids_within_0_to_n_pass(shim, preset, ids):
    config = build(model_dir(preset), ids)
    hf_config = config.speculative_config.draft_model_config.hf_config
    assert list(hf_config.eagle_aux_hidden_state_layer_ids) == list(ids)


@pytest.mark.full_tier
def test_a_model_class_without_eagle3_is_refused_with_class_and_version(shim, models):
    message = refused(models["gpt2"], (1, 2))
    assert f"{PREFIX}hidden-state extraction needs EAGLE-3 auxiliary" in message
    assert f"vLLM {PATCHER.version_of('vllm')}'s model class GPT2LMHeadModel" in message
    assert "does not implement vLLM's SupportsEagle3" in message


@pytest.mark.full_tier
def test_without_the_patch_vllm_builds_them_and_fails_after_loading_weights(no_shim, models):
    # Qwen3-Next passes vLLM's own model-type check ("qwen") on every release.
    assert build(models["qwen3_next"], (1, 2, 4)).speculative_config is not None
    if VLLM < Version("0.22"):  # 0.20/0.21 check model types by name, not classes
        with pytest.raises(ValueError, match="extract_hidden_states is only supported for"):
            build(models["gpt2"], (1, 2))
    else:
        assert build(models["gpt2"], (1, 2)).speculative_config is not None


def test_qwen3_next_is_checked_against_this_vllm(shim, models):
    # vLLM's Qwen3NextForCausalLM implements SupportsEagle3 from 0.24.0.
    if VLLM < Version("0.24"):
        assert "model class Qwen3NextForCausalLM" in refused(models["qwen3_next"], (1, 2, 4))
    else:
        build(models["qwen3_next"], (1, 2, 4))


def test_other_speculative_methods_are_left_alone(shim):
    config = with_speculative_config({"method": "ngram", "num_speculative_tokens": 2})
    assert config.speculative_config.method == "ngram"
