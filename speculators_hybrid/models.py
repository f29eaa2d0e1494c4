"""Model configs the package builds itself: no hub.

`write_config(folder, preset)` writes a `config.json` that vLLM and transformers load
offline. Presets are Qwen3.5-family hybrids (Gated DeltaNet : full attention = 3 : 1);
`qwen3.6-27b` is the published Qwen3.6-27B config's text model.
`drafter_config(target, algorithm)` is the config.json speculators 0.9.0 saves for a drafter of
such a target. `save_random_model` (needs torch and transformers) saves random weights for GPU
tests and benchmarks.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# text_config fields; "layers" is the number of decoder layers (every 4th is full attention).
PRESETS: dict[str, dict[str, Any]] = {
    # The published Qwen3.6-27B config's text model: 64 layers = 16 full attention + 48 GDN,
    # hidden 5120; every field that changes vLLM's plan or kernels (the rest: text_config()).
    "qwen3.6-27b": dict(
        layers=64,
        hidden_size=5120,
        intermediate_size=17408,
        num_attention_heads=24,
        num_key_value_heads=4,
        head_dim=256,
        linear_num_key_heads=16,
        linear_num_value_heads=48,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        vocab_size=248320,
        max_position_embeddings=262144,
        mrope_section=[11, 11, 10],
        full_attention_interval=4,
        attn_output_gate=True,
        mamba_ssm_dtype="float32",  # the GDN state in float32 (vLLM's default: the model dtype)
        mtp_num_hidden_layers=1,  # a native MTP head (vLLM builds it for MTP decoding only)
    ),
    # A tiny random hybrid for quick runs and GPU proofs (heads divisible by 2 for TP=2).
    "tiny": dict(
        layers=8,
        hidden_size=256,
        intermediate_size=512,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=64,
        linear_value_head_dim=64,
        vocab_size=1024,
        max_position_embeddings=4096,
        mrope_section=[3, 3, 2],
    ),
}

# The trained target of the acceptance benchmark (benchmarks/acceptance/target.py): about 30M
# parameters, learnt on Python's own source with its own 4,096-id tokenizer.
PRESETS["stdlib-tiny"] = dict(
    PRESETS["tiny"],
    hidden_size=512,
    intermediate_size=1536,
    num_attention_heads=8,
    linear_num_key_heads=4,
    linear_num_value_heads=8,
    vocab_size=4096,
)


# The look-alike that the earlier GPU results ran (benchmarks/results/README.md says which): the
# real shape with the GDN state in bf16 (the model's dtype) and no MTP head field.
PRESETS["qwen3.6-27b-bf16-state"] = {
    k: v
    for k, v in PRESETS["qwen3.6-27b"].items()
    if k not in ("mamba_ssm_dtype", "mtp_num_hidden_layers")
}

# Old names still accepted (`resolve`): the dated results' commands pass them.
ALIASES = {"qwen3.6-27b-like": "qwen3.6-27b-bf16-state"}

# GPU benchmarks: 8 layers (6 GDN + 2 full attention) at a 9B-class width, small vocabulary.
PRESETS["wide-8l"] = dict(
    PRESETS["qwen3.6-27b-bf16-state"],
    layers=8,
    hidden_size=4096,
    intermediate_size=12288,
    num_attention_heads=16,
    linear_num_value_heads=32,
    vocab_size=2048,
    max_position_embeddings=32768,
)


def resolve(preset: str) -> str:
    """The preset's name, an old name (ALIASES) replaced by the current one."""
    preset = ALIASES.get(preset, preset)
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    return preset


def deprecation(preset: str) -> str:
    """One line for an old preset name ('' for a current one)."""
    if preset not in ALIASES:
        return ""
    return (
        f"preset {preset!r} is deprecated: it is {ALIASES[preset]!r} (the bf16-state look-alike "
        "of the dated results); the real config is 'qwen3.6-27b'"
    )


def text_config(preset: str) -> dict[str, Any]:
    p = dict(PRESETS[resolve(preset)])
    layers = p.pop("layers")
    # vLLM checks sum(mrope_section) == head_dim * partial_rotary_factor / 2
    mrope = p.pop("mrope_section")
    return {
        "model_type": "qwen3_5_text",
        "num_hidden_layers": layers,
        "layer_types": [
            "full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)
        ],
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "linear_conv_kernel_dim": 4,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": mrope,
            "mrope_interleaved": True,
        },
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
        **p,
    }


def config_dict(preset: str, multimodal: bool = True) -> dict[str, Any]:
    text = text_config(preset)
    if not multimodal:
        return {**text, "architectures": ["Qwen3_5ForCausalLM"]}
    hidden = text["hidden_size"]
    return {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": text,
        "vision_config": {
            "model_type": "qwen3_5",
            "depth": 2,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_heads": 2,
            "in_channels": 3,
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "out_hidden_size": hidden,
            "num_position_embeddings": 64,
        },
        "image_token_id": text["vocab_size"] - 4,
        "video_token_id": text["vocab_size"] - 3,
        "vision_start_token_id": text["vocab_size"] - 2,
        "vision_end_token_id": text["vocab_size"] - 1,
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
    }


# A minimal ChatML template: what speculators' prepare-data renders and the acceptance prompts use.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def write_chat_files(folder: str | Path, chat_template: str = CHAT_TEMPLATE) -> None:
    """Complete a saved multimodal checkpoint as a real Qwen3.5 one is: the chat template (in
    tokenizer_config.json and chat_template.jinja) and the image and video processor configs
    that speculators' `AutoProcessor` reads (Qwen3.5's video processor needs torchvision)."""
    folder = Path(folder)
    tokenizer = folder / "tokenizer_config.json"
    config = json.loads(tokenizer.read_text()) if tokenizer.exists() else {}
    tokenizer.write_text(json.dumps({**config, "chat_template": chat_template}, indent=2))
    (folder / "chat_template.jinja").write_text(chat_template)
    vision = {"patch_size": 16, "temporal_patch_size": 2, "merge_size": 2}
    processors = {
        "preprocessor_config.json": {"image_processor_type": "Qwen2VLImageProcessor"},
        "video_preprocessor_config.json": {"video_processor_type": "Qwen3VLVideoProcessor"},
    }
    for name, kind in processors.items():
        entry = {**kind, "processor_class": "Qwen3VLProcessor", **vision}
        (folder / name).write_text(json.dumps(entry, indent=2))


def write_config(folder: str | Path, preset: str = "tiny", multimodal: bool = True) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config_dict(preset, multimodal), indent=2))
    return folder


SLIDING = "sliding_attention"  # a sliding-window layer in `layer_types`


def drafter_config(
    target: str | Path,
    algorithm: str = "dflash",
    layers: int = 1,
    block: int = 4,
    layer_types: list[str] | None = None,
    kv_heads: int = 0,
    heads: int = 0,
    aux_ids: tuple[int, ...] = (1, 2, 3),
) -> dict[str, Any]:
    """A drafter's config.json as speculators 0.9.0 saves it for the Qwen3.5-family `target`
    folder: its draft layers' dims and rope are the verifier's as speculators derives them (the
    M-RoPE section rescaled to the whole head, `partial_rotary_factor` 1.0), every DFlash layer
    a 2,048-token sliding-window one unless `layer_types` says otherwise; `kv_heads` and `heads`
    give another drafter's."""
    text = json.loads((Path(target) / "config.json").read_text())["text_config"]
    hidden, head_dim, vocab = text["hidden_size"], text["head_dim"], text["vocab_size"]
    default_heads = text["num_attention_heads"]
    if hidden % default_heads and not hidden % head_dim:
        default_heads = hidden // head_dim  # speculators' rule
    rope = {k: v for k, v in text["rope_parameters"].items() if k != "mrope_interleaved"}
    if "mrope_section" in rope:
        factor = rope.get("partial_rotary_factor", 1.0)
        rope["mrope_section"] = [round(s / factor) for s in rope["mrope_section"]]
    rope["partial_rotary_factor"] = 1.0
    types = layer_types or [SLIDING if algorithm == "dflash" else "full_attention"] * layers
    layer = {
        "model_type": "qwen3" if algorithm == "dflash" else "llama",
        "hidden_act": "silu",
        "hidden_size": hidden,
        "intermediate_size": text["intermediate_size"],
        "head_dim": head_dim,
        "num_attention_heads": heads or default_heads,
        "num_key_value_heads": kv_heads or text["num_key_value_heads"],
        "num_hidden_layers": len(types),
        "layer_types": types,
        "sliding_window": 2048,
        "use_sliding_window": SLIDING in types,
        "max_position_embeddings": text["max_position_embeddings"],
        "rms_norm_eps": 1e-6,
        "rope_parameters": rope,
        "tie_word_embeddings": False,
        "vocab_size": vocab,
    }
    config = {
        "speculators_model_type": algorithm,
        "speculators_version": "0.9.0",
        "draft_vocab_size": vocab,
        "target_hidden_size": hidden,
        "speculators_config": {
            "algorithm": algorithm,
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": block - 1}],
            "verifier": {
                "architectures": ["Qwen3_5ForConditionalGeneration"],
                "name_or_path": str(target),
            },
        },
        "transformer_layer_config": layer,
    }
    if algorithm == "eagle3":  # a Llama layer: no sliding window
        del layer["sliding_window"], layer["use_sliding_window"]
        return {**config, "architectures": ["Eagle3Speculator"], "norm_before_residual": True}
    return {
        **config,
        "architectures": ["DFlashSpeculator"],
        "aux_hidden_state_layer_ids": list(aux_ids),
        "block_size": block,
        "mask_token_id": vocab - 1,
        "sliding_window_non_causal": False,
    }


def hf_config(preset: str = "tiny", multimodal: bool = True) -> Any:
    """transformers' config of a preset; end-of-text and padding are id 0 (no BOS)."""
    from transformers import Qwen3_5Config, Qwen3_5TextConfig

    raw = config_dict(preset, multimodal)
    text = raw["text_config"] if multimodal else raw
    text.update(eos_token_id=0, pad_token_id=0, bos_token_id=None)
    return Qwen3_5Config(**raw) if multimodal else Qwen3_5TextConfig(**raw)


def save_random_model(
    folder: str | Path, model_cls: Any, config: Any, seed: int = 0, device: str = "cpu"
) -> Path:
    """`model_cls(config)` with transformers' random init (built on `device`), saved in bf16."""
    import torch

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    with torch.device(device):
        model = model_cls(config).eval()
    model = model.to(torch.bfloat16)
    model.config.dtype = torch.bfloat16  # written as "dtype": "bfloat16"
    model.save_pretrained(folder, safe_serialization=True)
    return folder
