"""`mtp-final-norm` against speculators' real MTP model and transformers' real Qwen3.5 norm.

A tiny verifier carries a native MTP head (random `mtp.*` weights, named as Qwen3.5 checkpoints
name them) and a zero-centred final norm. `x` stands for a file's last layer id (the residual
stream before the final norm); vLLM serves the head `y`, the final norm's output (transformers'
`Qwen3_5RMSNorm` with the verifier's weight). Without the patch speculators trains the head on
`x`; with it, on `x` the model computes exactly what it computes on `y` unpatched.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch
import transformers as tf
from conftest import VERSION
from packaging.version import Version
from safetensors.torch import load_file, save_file
from tiny_models import HIDDEN, VOCAB, text_kwargs, transformers_norm

from speculators_hybrid.speculators_patches import PATCHER, PATCHES

pytestmark = pytest.mark.skipif(VERSION < Version("0.8.0"), reason="MTP from speculators 0.8.0")

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
    """A verifier with an MTP head: config, embeddings, lm_head, final norm, `mtp.*`."""
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


def build(path: str):
    from speculators.models.mtp.core import MTPDraftModel

    config = tf.AutoConfig.from_pretrained(path)
    return MTPDraftModel.from_training_args(config, verifier_name_or_path=path).eval()


def batch(seed: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (1, 12), generator=gen)
    return ids, torch.randn(1, 12, HIDDEN, generator=gen) * 3


def logits(model, ids: torch.Tensor, hidden: torch.Tensor, positional: bool = False):
    with torch.no_grad():
        out = model(ids, hidden) if positional else model(input_ids=ids, hidden_states=hidden)
    return out[0]


@pytest.fixture(scope="module")
def qwen35(tmp_path_factory) -> tuple[str, torch.Tensor]:
    return write_mtp_verifier(tmp_path_factory.mktemp("mtp"), "qwen3_5_text")


def test_installed_release_selects_and_matches_the_target():
    (patch,) = [p for p in PATCHER.select(PATCHES) if p.id == "mtp-final-norm"]
    for target in patch.targets:
        PATCHER.verify(patch, target, importlib.import_module(target.module))


def test_without_the_patch_the_head_trains_on_another_input(unpatched, qwen35):
    path, weight = qwen35
    model = build(path)
    assert not hasattr(model, "verifier_norm")
    ids, x = batch()
    served = transformers_norm("qwen3_5_text", weight)(x)
    trained, wanted = logits(model, ids, x), logits(model, ids, served)
    assert len(trained) == 3
    assert not torch.allclose(trained[0], wanted[0], atol=1e-3)


@pytest.mark.parametrize("positional", [False, True], ids=["keywords", "positional"])
def test_patched_head_sees_what_vllm_serves(unpatched, qwen35, positional):
    path, weight = qwen35
    ids, x = batch()
    served = transformers_norm("qwen3_5_text", weight)(x)
    wanted = logits(build(path), ids, served)
    PATCHER.apply(PATCHES)
    model = build(path)
    assert torch.equal(model.verifier_norm.weight, weight)  # loaded by speculators itself
    assert not model.verifier_norm.weight.requires_grad
    got = logits(model, ids, x, positional)
    assert all(torch.equal(a, b) for a, b in zip(got, wanted, strict=True))


def test_saved_checkpoint_has_no_norm_of_its_own(patched, qwen35, tmp_path):
    model = build(qwen35[0])
    model.save_pretrained(tmp_path / "saved")
    (saved,) = (tmp_path / "saved").glob("*.safetensors")
    keys = set(load_file(str(saved)))
    assert "verifier_norm.weight" not in keys
    assert keys and all(k.startswith("mtp_layers.0.") or k == "rotary_emb.inv_freq" for k in keys)


def test_other_verifiers_are_left_alone(patched, tmp_path):
    path, _ = write_mtp_verifier(tmp_path, "qwen3")
    model = build(path)
    assert not hasattr(model, "verifier_norm")
    assert not model._forward_pre_hooks
