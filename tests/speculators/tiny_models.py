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


def build(algorithm: str, verifier: str, eps: float = EPS, draft_config=None):
    """An EAGLE-3 or DFlash drafter for `verifier`, through speculators' own training path
    (`eps`: the draft config's `rms_norm_eps`, which speculators gives its verifier norm;
    `draft_config`: a whole decoder config instead, e.g. the one `speculators train` builds)."""
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
    draft = {**text_kwargs(layers=1), "rms_norm_eps": eps}
    if algorithm == "eagle3":
        from speculators.models.eagle3.core import Eagle3DraftModel

        config = draft_config or tf.LlamaConfig(**draft)
        return Eagle3DraftModel.from_training_args(config, **kwargs)
    from speculators.models.dflash.core import DFlashDraftModel

    return DFlashDraftModel.from_training_args(draft_config or tf.Qwen3Config(**draft), **kwargs)


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


# Hybrid families: tiny random transformers models, saved by `save_pretrained` (all weights),
# so speculators reads a checkpoint laid out exactly as transformers writes that family.
# Scaling values of released checkpoints (their config.json as quoted in public code):
# ibm-granite/granite-4.0-h-tiny (embedding 12, logits_scaling 6; residual / attention
# multipliers of the Granite 4.0 family), tiiuae/Falcon-H1-0.5B (Megatron-Bridge's tests).
GRANITE_H_TINY_SCALES = dict(
    embedding_multiplier=12.0,
    logits_scaling=6.0,
    residual_multiplier=0.22,
    attention_multiplier=0.0078125,
)
FALCON_H1_05B_SCALES = dict(
    embedding_multiplier=5.656854249492381,
    lm_head_multiplier=0.0390625,
    key_multiplier=0.39062499999999994,
    attention_out_multiplier=0.9375,
    ssm_in_multiplier=1.25,
    ssm_out_multiplier=0.23570226039551587,
    mlp_multipliers=[0.8838834764831844, 0.5859375],
    ssm_multipliers=[0.3535533905932738, 0.25, 0.3535533905932738, 0.5, 0.3535533905932738],
)
HYBRID = ("nemotron_h", "granitemoehybrid", "falcon_h1", "jamba", "lfm2", "lfm2_moe", "qwen3_next")
# model_type -> (final-norm module under the model's base, the config field holding its eps)
FINAL_NORM = {
    "nemotron_h": ("norm_f", "layer_norm_epsilon"),
    "granitemoehybrid": ("norm", "rms_norm_eps"),
    "falcon_h1": ("final_layernorm", "rms_norm_eps"),
    "jamba": ("final_layernorm", "rms_norm_eps"),
    "lfm2": ("embedding_norm", "norm_eps"),
    "lfm2_moe": ("embedding_norm", "norm_eps"),
    "qwen3_next": ("norm", "rms_norm_eps"),
}


def family_config(model_type: str) -> tf.PretrainedConfig:
    """A 4-layer transformers config of `model_type`, hidden size HIDDEN, vocabulary VOCAB."""
    base = dict(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    mamba2 = dict(mamba_n_heads=4, mamba_d_head=32, mamba_n_groups=1, mamba_d_state=8)
    make = {
        "nemotron_h": lambda: tf.NemotronHConfig(
            **base,
            head_dim=16,
            layers_block_type=["mamba", "attention", "mlp", "mamba"],
            mamba_num_heads=4,
            mamba_head_dim=32,
            n_groups=2,
            ssm_state_size=8,
            chunk_size=16,
            layer_norm_epsilon=1e-5,
        ),
        "granitemoehybrid": lambda: tf.GraniteMoeHybridConfig(
            **base,
            **mamba2,
            **GRANITE_H_TINY_SCALES,
            num_hidden_layers=4,
            layer_types=["mamba", "attention", "mamba", "mamba"],
            mamba_chunk_size=16,
            num_local_experts=4,
            num_experts_per_tok=2,
            shared_intermediate_size=64,
            position_embedding_type="nope",
            rms_norm_eps=1e-5,
            tie_word_embeddings=True,
        ),
        "falcon_h1": lambda: tf.FalconH1Config(
            **base,
            **mamba2,
            **FALCON_H1_05B_SCALES,
            num_hidden_layers=4,
            head_dim=16,
            mamba_d_ssm=128,
            mamba_chunk_size=16,
            mamba_rms_norm=True,
            rms_norm_eps=1e-5,
            tie_word_embeddings=False,
        ),
        "jamba": lambda: tf.JambaConfig(
            **base,
            num_hidden_layers=4,
            attn_layer_period=2,
            attn_layer_offset=1,
            expert_layer_period=2,
            expert_layer_offset=1,
            num_experts=2,
            num_experts_per_tok=1,
            mamba_d_state=8,
            mamba_dt_rank=8,
            rms_norm_eps=1e-6,
        ),
        "lfm2": lambda: tf.Lfm2Config(
            **base,
            num_hidden_layers=4,
            layer_types=["conv", "full_attention", "conv", "conv"],
            norm_eps=1e-5,
            tie_word_embeddings=True,
        ),
        "lfm2_moe": lambda: tf.Lfm2MoeConfig(
            **base,
            num_hidden_layers=4,
            layer_types=["conv", "full_attention", "conv", "conv"],
            moe_intermediate_size=64,
            num_dense_layers=1,
            num_experts=4,
            num_experts_per_tok=2,
            norm_eps=1e-5,
            tie_word_embeddings=True,
        ),
        "qwen3_next": lambda: tf.Qwen3NextConfig(
            **base,
            head_dim=16,
            num_hidden_layers=4,
            layer_types=["linear_attention"] * 3 + ["full_attention"],
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
            rms_norm_eps=1e-6,
        ),
    }
    return make[model_type]()


def final_norm(model: tf.PreTrainedModel) -> torch.nn.Module:
    """The final norm module of a transformers causal LM of one of HYBRID."""
    return getattr(model.base_model, FINAL_NORM[model.config.model_type][0])


def family_eps(model: tf.PreTrainedModel) -> float:
    return float(getattr(model.config, FINAL_NORM[model.config.model_type][1]))


def write_family(root: Path, model_type: str, seed: int = 0) -> tuple[str, tf.PreTrainedModel]:
    """A random `model_type` model saved with `save_pretrained`, and the model itself.

    Every norm weight is random and distinct (a picked layer norm would not pass for the final
    one); `1 + w` families get zero-centred weights, the others weights around 1.
    """
    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(family_config(model_type)).eval()
    centre = 0.0 if model_type in ONE_PLUS_W else 1.0
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("norm_f.weight"):
                param.copy_(centre + 0.3 * torch.randn_like(param))
    path = root / model_type
    model.save_pretrained(path)
    return str(path), model


# speculators' converter maps these checkpoint names to its own (convert/mtp/converter.py)
TO_CHECKPOINT = (
    ("mtp_layers.0.input_proj.weight", "mtp.fc.weight"),
    ("mtp_layers.0.final_layernorm.", "mtp.norm."),
    ("mtp_layers.0.hidden_layernorm.", "mtp.pre_fc_norm_hidden."),
    ("mtp_layers.0.token_layernorm.", "mtp.pre_fc_norm_embedding."),
    ("mtp_layers.0.", "mtp.layers.0."),
)


def checkpoint_name(key: str) -> str:
    for ours, theirs in TO_CHECKPOINT:
        if key.startswith(ours):
            return theirs + key[len(ours) :]
    raise AssertionError(key)


def write_mtp_verifier(root: Path, model_type: str) -> tuple[str, torch.Tensor]:
    """A verifier with a native MTP head (random `mtp.*` weights, its norms zero-centred like a
    trained model's), embeddings, lm_head and final norm; and the final norm's weight."""
    from speculators.models.mtp.model_definitions import mtp_model_classes

    config = {"qwen3_5_text": tf.Qwen3_5TextConfig, "qwen3": tf.Qwen3Config}[model_type](
        **text_kwargs(), mtp_num_hidden_layers=1
    )
    path = root / model_type
    config.save_pretrained(path)
    torch.manual_seed(0)
    layer = mtp_model_classes[model_type].first_layer_class(config, layer_idx=0)
    weights = {checkpoint_name(f"mtp_layers.0.{k}"): v for k, v in layer.state_dict().items()}
    for key, value in weights.items():
        if "norm" in key:  # zero-centred gains that differ by channel, as a trained model's
            weights[key] = torch.randn_like(value) * 0.3
    gen = torch.Generator().manual_seed(1)
    norm = torch.randn(HIDDEN, generator=gen) * 0.3
    weights["model.embed_tokens.weight"] = torch.randn(VOCAB, HIDDEN, generator=gen)
    weights["lm_head.weight"] = torch.randn(VOCAB, HIDDEN, generator=gen)
    weights["model.norm.weight"] = norm
    save_file({k: v.contiguous() for k, v in weights.items()}, str(path / "model.safetensors"))
    return str(path), norm


def build_mtp(path: str):
    """speculators' MTP drafter for `path`, through its own training path (`from_training_args`
    converts the checkpoint's native head and loads the verifier's weights)."""
    from speculators.models.mtp.core import MTPDraftModel

    config = tf.AutoConfig.from_pretrained(path)
    return MTPDraftModel.from_training_args(config, verifier_name_or_path=path).eval()
