"""Published configs of the other hybrid families, for `doctor` and the planning tests.

Each preset is the `config.json` of a released checkpoint, cut to the fields vLLM's config
parser and KV-cache planning read (sizes of the attention, state and hidden layers; the layer
pattern; vocabulary and max positions; MoE sizes only so the config is valid: vLLM plans KV
per layer, experts do not change it). No weights, no tokenizer: `doctor DIR` plans from it.

    python -m speculators_hybrid.family_presets NAME DIR    # writes DIR/config.json
    speculators-hybrid doctor DIR

Sources (a field that was not found is marked in its preset, with the value used and why):
- nvidia/Nemotron-H-8B-Base-8K: its config.json as quoted in NVIDIA Megatron-Bridge's tests
  (tests/.../test_nemotronh_bridge.py, `nemotronh_8b_config_dict`) and Megatron-Bridge's
  `NemotronHModelProvider8B` (pattern, heads, Mamba sizes).
- nvidia/Nemotron-H-47B-Base-8K: Megatron-Bridge's `NemotronHModelProvider47B` and the family
  defaults of `NemotronHModelProvider` (Mamba head dim 64, 8 groups, 8 KV heads, 8,192 tokens).
- ibm-granite/granite-4.0-h-small: its config.json as quoted (relevant fields) in a public
  sizing tool's docs; the attention positions (5, 15, 25, 35 of 40) from a published GGUF
  card of the model.
- tiiuae/Falcon-H1-7B-Instruct: its config.json as quoted in a public sizing tool's tests;
  tiiuae/Falcon-H1-34B-Instruct: the model table of transformers' FalconH1 docs.
- ai21labs/AI21-Jamba-Mini-1.5 (Jamba-Mini-1.7 has the same architecture): its config.json as
  quoted in onnx-diagnostic (`get_ai21_jamba_15_mini`, linking the hub file).
- LiquidAI/LFM2-2.6B: its model card (30 layers, 22 conv + 8 attention, vocabulary 65,536,
  32,768-token context) and its config as quoted in public tests (layer_types, conv sizes).
- LiquidAI/LFM2-8B-A1B (`lfm2_moe`): its model card (24 layers, 18 conv + 6 attention,
  vocabulary 65,536, 32,768-token context; 32 experts, top-4, the first two layers dense) and
  the config.json of a published fine-tune of it (same architecture; layer_types, sizes, MoE
  fields), which also match transformers' `Lfm2MoeConfig` defaults ("similar to LFM2-8B-A1B").
  The base checkpoint's own config.json was not found.
- Zyphra/Zamba2-2.7B-Instruct-v2 (`zamba2`): its config.json as the hub shows it (54 layers,
  hybrid at 6, 12, ..., 42, 47, 51; Mamba-2 sizes; 4,096 tokens); heads, KV heads, shared
  blocks and vocabulary from Zyphra/Zamba2-2.7B-instruct's earlier config.json (same model).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

NEMOTRON_H_8B_PATTERN = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"
NEMOTRON_H_47B_PATTERN = (
    "M-M-M-M-M-M-M-M-M*-M-M-M-M-M-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-M-M---MM---M-M*"
    "-M-M-M-M-M-"
)
GRANITE_H_SMALL_ATTENTION = (5, 15, 25, 35)
LFM2_2_6B_ATTENTION = (2, 5, 9, 13, 17, 21, 24, 27)
LFM2_8B_A1B_ATTENTION = (2, 6, 10, 14, 18, 21)
ZAMBA2_2_7B_HYBRID = (6, 12, 18, 24, 30, 36, 42, 47, 51)

PRESETS: dict[str, dict[str, Any]] = {
    "nemotron-h-8b": {
        "architectures": ["NemotronHForCausalLM"],
        "model_type": "nemotron_h",
        "num_hidden_layers": 52,
        "hybrid_override_pattern": NEMOTRON_H_8B_PATTERN,
        "hidden_size": 4096,
        "intermediate_size": 21504,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,  # the hub file spells it attention_head_dim
        "attention_head_dim": 128,
        "mamba_num_heads": 128,
        "mamba_head_dim": 64,
        "n_groups": 8,
        "ssm_state_size": 128,
        "conv_kernel": 4,
        "expand": 2,
        "chunk_size": 128,
        "mlp_hidden_act": "relu2",
        "vocab_size": 131072,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    },
    "nemotron-h-47b": {
        "architectures": ["NemotronHForCausalLM"],
        "model_type": "nemotron_h",
        "num_hidden_layers": 98,
        "hybrid_override_pattern": NEMOTRON_H_47B_PATTERN,
        "hidden_size": 8192,
        "intermediate_size": 30720,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 128,  # Megatron's kv_channels default (the 8B's 128 too)
        "attention_head_dim": 128,
        "mamba_num_heads": 256,
        "mamba_head_dim": 64,
        "n_groups": 8,
        "ssm_state_size": 256,
        "conv_kernel": 4,
        "expand": 2,
        "chunk_size": 128,
        "mlp_hidden_act": "relu2",
        "vocab_size": 131072,  # not found for the 47B: the family's (8B, 56B) 131,072
        "max_position_embeddings": 8192,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    },
    "granite-4.0-h-small": {
        "architectures": ["GraniteMoeHybridForCausalLM"],
        "model_type": "granitemoehybrid",
        "num_hidden_layers": 40,
        "layer_types": [
            "attention" if i in GRANITE_H_SMALL_ATTENTION else "mamba" for i in range(40)
        ],
        "hidden_size": 4096,
        "intermediate_size": 768,
        "shared_intermediate_size": 1536,
        "num_local_experts": 72,
        "num_experts_per_tok": 10,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        # Not found: mamba_n_heads, mamba_d_head, mamba_n_groups, mamba_chunk_size. Used:
        # transformers' GraniteMoeHybridConfig defaults (128 heads; head dim "auto" =
        # expand x hidden / heads = 64; 1 group; chunk 256).
        "mamba_n_heads": 128,
        "mamba_d_head": 64,
        "mamba_n_groups": 1,
        "mamba_d_state": 128,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        "mamba_chunk_size": 256,
        "mamba_conv_bias": True,
        "mamba_proj_bias": False,
        "position_embedding_type": "nope",
        "vocab_size": 100352,
        "max_position_embeddings": 131072,  # the 128K context of the model card
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
    },
    "falcon-h1-7b": {
        "architectures": ["FalconH1ForCausalLM"],
        "model_type": "falcon_h1",
        "num_hidden_layers": 44,  # attention and Mamba-2 side by side in every layer
        "hidden_size": 3072,
        "intermediate_size": 12288,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "head_dim": 128,
        "mamba_d_ssm": 3072,
        "mamba_n_heads": 24,
        "mamba_d_head": 128,
        "mamba_n_groups": 1,
        "mamba_d_state": 256,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        "mamba_chunk_size": 128,
        "vocab_size": 130048,
        "max_position_embeddings": 262144,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    },
    "falcon-h1-34b": {
        "architectures": ["FalconH1ForCausalLM"],
        "model_type": "falcon_h1",
        "num_hidden_layers": 72,
        "hidden_size": 5120,
        "intermediate_size": 14336,  # not found: transformers' FalconH1Config default
        "num_attention_heads": 20,
        "num_key_value_heads": 4,
        "head_dim": 128,
        # not found: mamba_d_ssm; used heads x head dim (the 7B's 3072 = 24 x 128 is too)
        "mamba_d_ssm": 4096,
        "mamba_n_heads": 32,
        "mamba_d_head": 128,
        "mamba_n_groups": 1,  # not found: the 7B's (and transformers' default) 1
        "mamba_d_state": 256,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        "mamba_chunk_size": 128,
        "vocab_size": 261120,  # "Falcon-H1 BPE 261k (34B)"; exact figure not found
        "max_position_embeddings": 262144,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    },
    "jamba-mini-1.5": {
        "architectures": ["JambaForCausalLM"],
        "model_type": "jamba",
        "num_hidden_layers": 32,
        "attn_layer_period": 8,
        "attn_layer_offset": 4,  # attention at 4, 12, 20, 28; Mamba elsewhere
        "expert_layer_period": 2,
        "expert_layer_offset": 1,
        "num_experts": 16,
        "num_experts_per_tok": 2,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "mamba_d_state": 16,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        "mamba_dt_rank": 256,
        "mamba_conv_bias": True,
        "mamba_proj_bias": False,
        "vocab_size": 65536,
        "max_position_embeddings": 262144,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    },
    "lfm2-2.6b": {
        "architectures": ["Lfm2ForCausalLM"],
        "model_type": "lfm2",
        "num_hidden_layers": 30,
        "layer_types": [
            "full_attention" if i in LFM2_2_6B_ATTENTION else "conv" for i in range(30)
        ],
        "hidden_size": 2048,
        "intermediate_size": 10752,
        "block_auto_adjust_ff_dim": False,  # 10752 is the final width
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "conv_L_cache": 3,
        "conv_dim": 2048,
        "block_dim": 2048,
        "conv_bias": False,
        "vocab_size": 65536,
        # The model card's context is 32,768 tokens; the published config says 128,000.
        "max_position_embeddings": 128000,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
    },
    "lfm2-8b-a1b": {
        "architectures": ["Lfm2MoeForCausalLM"],
        "model_type": "lfm2_moe",
        "num_hidden_layers": 24,
        "layer_types": [
            "full_attention" if i in LFM2_8B_A1B_ATTENTION else "conv" for i in range(24)
        ],
        "hidden_size": 2048,
        "intermediate_size": 7168,  # the two dense layers
        "moe_intermediate_size": 1792,
        "num_dense_layers": 2,
        "num_experts": 32,
        "num_experts_per_tok": 4,
        "use_expert_bias": True,
        "norm_topk_prob": True,
        "routed_scaling_factor": 1.0,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "conv_L_cache": 3,
        "conv_bias": False,
        "norm_eps": 1e-05,
        "rope_theta": 1000000.0,
        "vocab_size": 65536,
        # The model card's context is 32,768 tokens; the published config says 128,000.
        "max_position_embeddings": 128000,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
    },
    "zamba2-2.7b": {
        "architectures": ["Zamba2ForCausalLM"],
        "model_type": "zamba2",
        "num_hidden_layers": 54,
        # each hybrid layer runs one of the shared attention + MLP blocks, then its Mamba-2
        "layers_block_type": ["hybrid" if i in ZAMBA2_2_7B_HYBRID else "mamba" for i in range(54)],
        "num_mem_blocks": 2,
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "num_attention_heads": 32,  # over attention_hidden_size 5120: head dim 160
        "num_key_value_heads": 32,
        "mamba_d_state": 64,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        "n_mamba_heads": 80,  # mamba_headdim 64
        "mamba_ngroups": 1,
        "chunk_size": 256,
        "adapter_rank": 128,
        "rms_norm_eps": 1e-05,
        "vocab_size": 32000,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
    },
}
assert len(NEMOTRON_H_8B_PATTERN) == 52 and len(NEMOTRON_H_47B_PATTERN) == 98
assert len(LFM2_8B_A1B_ATTENTION) == 6  # 18 conv + 6 attention (the model card)


def config_dict(name: str) -> dict[str, Any]:
    if name not in PRESETS:
        raise ValueError(f"unknown family preset {name!r}; choose one of {', '.join(PRESETS)}")
    return json.loads(json.dumps(PRESETS[name]))  # a copy


def write_family_config(folder: str | Path, name: str) -> Path:
    """`folder/config.json` for preset `name` (vLLM's config parser reads it offline)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config_dict(name), indent=2))
    return folder


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] not in PRESETS:
        print(
            "usage: python -m speculators_hybrid.family_presets NAME DIR  "
            f"(NAME: {', '.join(PRESETS)})",
            file=sys.stderr,
        )
        return 2
    print(write_family_config(args[1], args[0]) / "config.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
