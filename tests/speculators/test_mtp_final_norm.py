"""`mtp-final-norm` against speculators' real MTP model and transformers' real Qwen3.5 norm.

A tiny verifier carries a native MTP head (random `mtp.*` weights, named as Qwen3.5 checkpoints
name them) and a zero-centred final norm. `x` stands for a file's last layer id (the residual
stream before the final norm); vLLM serves the head `y`, the final norm's output (transformers'
`Qwen3_5RMSNorm` with the verifier's weight). Without the patch speculators trains the head on
`x`; with it, on `x` the model computes exactly what it computes on `y` unpatched.
"""

from __future__ import annotations

import importlib

import pytest
import torch
from conftest import VERSION
from packaging.version import Version
from safetensors.torch import load_file
from tiny_models import HIDDEN, VOCAB, build_mtp, transformers_norm, write_mtp_verifier

from speculators_hybrid.speculators_patches import PATCHER, PATCHES

pytestmark = pytest.mark.skipif(VERSION < Version("0.8.0"), reason="MTP from speculators 0.8.0")


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
    model = build_mtp(path)
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
    wanted = logits(build_mtp(path), ids, served)
    PATCHER.apply(PATCHES)
    model = build_mtp(path)
    assert torch.equal(model.verifier_norm.weight, weight)  # loaded by speculators itself
    assert not model.verifier_norm.weight.requires_grad
    got = logits(model, ids, x, positional)
    assert all(torch.equal(a, b) for a, b in zip(got, wanted, strict=True))


def test_saved_checkpoint_has_no_norm_of_its_own(patched, qwen35, tmp_path):
    model = build_mtp(qwen35[0])
    model.save_pretrained(tmp_path / "saved")
    (saved,) = (tmp_path / "saved").glob("*.safetensors")
    keys = set(load_file(str(saved)))
    assert "verifier_norm.weight" not in keys
    assert keys and all(k.startswith("mtp_layers.0.") or k == "rotary_emb.inv_freq" for k in keys)


def test_other_verifiers_are_left_alone(patched, tmp_path):
    path, _ = write_mtp_verifier(tmp_path, "qwen3")
    model = build_mtp(path)
    assert not hasattr(model, "verifier_norm")
    assert not model._forward_pre_hooks
