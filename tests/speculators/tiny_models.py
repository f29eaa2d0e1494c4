"""Tiny verifier checkpoints and speculators drafters built the way speculators' trainer does.

A verifier is a directory with transformers' own `config.json` for its model type and a
`model.safetensors` holding the three tensors speculators loads from it (embeddings, lm_head,
final norm). Drafters come from speculators' `from_training_args`, which builds the model
and loads those verifier weights into `verifier_norm` / `verifier_lm_head`.
"""

from __future__ import annotations

from pathlib import Path

import torch
import transformers as tf
from safetensors.torch import save_file

HIDDEN, VOCAB, EPS = 64, 128, 1e-6
ONE_PLUS_W = ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_next")


def text_kwargs(layers: int = 4) -> dict:
    return dict(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rms_norm_eps=EPS,
    )


def _config(model_type: str) -> tuple[tf.PretrainedConfig, str]:
    """transformers' config for `model_type`, and the prefix of its text weights."""
    text = text_kwargs()
    return {
        "qwen3_5": lambda: (tf.Qwen3_5Config(text_config=text), "model.language_model."),
        "qwen3_5_text": lambda: (tf.Qwen3_5TextConfig(**text), "model."),
        "qwen3_5_moe": lambda: (tf.Qwen3_5MoeConfig(text_config=text), "model.language_model."),
        "qwen3_5_moe_text": lambda: (tf.Qwen3_5MoeTextConfig(**text), "model."),
        "qwen3_next": lambda: (tf.Qwen3NextConfig(**text), "model."),
        "qwen3": lambda: (tf.Qwen3Config(**text), "model."),
        "llama": lambda: (tf.LlamaConfig(**text), "model."),
    }[model_type]()


def write_verifier(root: Path, model_type: str, seed: int = 0) -> tuple[str, torch.Tensor]:
    """A verifier directory, and its final-norm weight (random, zero-centred like Qwen3.5's)."""
    path = root / model_type
    config, prefix = _config(model_type)
    config.save_pretrained(path)
    gen = torch.Generator().manual_seed(seed)
    norm = torch.randn(HIDDEN, generator=gen) * 0.3
    weights = {
        f"{prefix}embed_tokens.weight": torch.randn(VOCAB, HIDDEN, generator=gen),
        "lm_head.weight": torch.randn(VOCAB, HIDDEN, generator=gen),
        f"{prefix}norm.weight": norm,
    }
    save_file(weights, str(path / "model.safetensors"))
    return str(path), norm


def build(algorithm: str, verifier: str):
    """An EAGLE-3 or DFlash drafter for `verifier`, through speculators' own training path."""
    kwargs = dict(
        verifier_name_or_path=verifier,
        draft_vocab_size=VOCAB,
        norm_before_residual=False,
        ttt_steps=2,
        target_layer_ids=[1, 2, 3],
        block_size=4,
        mask_token_id=0,
        max_anchors=16,
    )
    draft = text_kwargs(layers=1)
    if algorithm == "eagle3":
        from speculators.models.eagle3.core import Eagle3DraftModel

        return Eagle3DraftModel.from_training_args(tf.LlamaConfig(**draft), **kwargs)
    from speculators.models.dflash.core import DFlashDraftModel

    return DFlashDraftModel.from_training_args(tf.Qwen3Config(**draft), **kwargs)


def transformers_norm(model_type: str, weight: torch.Tensor) -> torch.nn.Module:
    """transformers' own final norm class for `model_type`, holding `weight`."""
    if model_type.startswith("qwen3_5_moe"):
        from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeRMSNorm as cls
    elif model_type.startswith("qwen3_5"):
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNorm as cls
    elif model_type == "qwen3_next":
        from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextRMSNorm as cls
    else:
        from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm as cls
    norm = cls(HIDDEN, eps=EPS)
    norm.load_state_dict({"weight": weight})
    return norm
