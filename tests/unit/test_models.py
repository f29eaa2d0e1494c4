"""The `qwen3.6-27b` preset is the published Qwen3.6-27B config's text model (issue 45).

PUBLISHED holds the fields of the published `config.json` (its text part) that change vLLM's
plan or kernels; the preset must give each of them as published. The GDN state in float32 is
what the GPU look-alike of the dated results lacked (tests/cpu/test_qwen36_planning.py plans it).
"""

from __future__ import annotations

import pytest

from speculators_hybrid import models

PUBLISHED = {
    "model_type": "qwen3_5_text",
    "num_hidden_layers": 64,
    "full_attention_interval": 4,
    "hidden_size": 5120,
    "intermediate_size": 17408,
    "num_attention_heads": 24,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "attn_output_gate": True,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 48,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "mamba_ssm_dtype": "float32",
    "mtp_num_hidden_layers": 1,
    "vocab_size": 248320,
    "tie_word_embeddings": False,
    "dtype": "bfloat16",
}
PUBLISHED_ROPE = {
    "rope_theta": 10000000.0,
    "partial_rotary_factor": 0.25,
    "mrope_section": [11, 11, 10],
    "mrope_interleaved": True,
}


def test_the_preset_is_the_published_text_config():
    text = models.config_dict("qwen3.6-27b")["text_config"]
    assert {k: text.get(k) for k in PUBLISHED} == PUBLISHED
    assert {k: text["rope_parameters"].get(k) for k in PUBLISHED_ROPE} == PUBLISHED_ROPE
    # every 4th layer is full attention: 16 of 64
    assert text["layer_types"] == (["linear_attention"] * 3 + ["full_attention"]) * 16


def test_the_bf16_state_variant_differs_only_in_the_state_and_the_mtp_head():
    real = models.text_config("qwen3.6-27b")
    look_alike = models.text_config("qwen3.6-27b-bf16-state")
    assert {k for k in real if real[k] != look_alike.get(k)} == {
        "mamba_ssm_dtype",
        "mtp_num_hidden_layers",
    }
    assert "mamba_ssm_dtype" not in look_alike  # vLLM keeps the state in the model dtype


def test_the_old_name_is_the_bf16_state_look_alike_with_a_note():
    assert models.resolve("qwen3.6-27b-like") == "qwen3.6-27b-bf16-state"
    assert models.text_config("qwen3.6-27b-like") == models.text_config("qwen3.6-27b-bf16-state")
    note = models.deprecation("qwen3.6-27b-like")
    assert "deprecated" in note and "'qwen3.6-27b'" in note and "\n" not in note
    assert models.deprecation("qwen3.6-27b") == ""
    with pytest.raises(ValueError, match="unknown preset 'qwen3.6-27b-lik'"):
        models.resolve("qwen3.6-27b-lik")
