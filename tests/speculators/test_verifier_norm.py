"""`verifier-norm-eagle3` / `verifier-norm-dflash` against speculators' real models and
transformers' real Qwen3.5 / Qwen3.5-MoE / Qwen3-Next norms, on random weights."""

from __future__ import annotations

import importlib
import inspect

import pytest
import torch
from conftest import ALGORITHMS, VERSION
from packaging.version import Version
from tiny_models import ONE_PLUS_W, build, transformers_norm

from speculators_hybrid.speculators_patches import PATCHER, PATCHES


def inputs(seed: int = 1) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 7, 64, generator=gen) * 3
    return [x, x.to(torch.bfloat16)]


def test_installed_release_selects_and_matches_every_target():
    selected = [p for p in PATCHER.select(PATCHES) if p.id.startswith("verifier-norm-")]
    assert {p.id for p in selected} == {f"verifier-norm-{a}" for a in ALGORITHMS}
    for patch in selected:
        for target in patch.targets:
            PATCHER.verify(patch, target, importlib.import_module(target.module))


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("model_type", ONE_PLUS_W)
def test_patched_norm_equals_transformers(patched, verifiers, algorithm, model_type):
    path, weight = verifiers(model_type)
    model = build(algorithm, path)
    norm = model.verifier_norm
    assert torch.equal(norm.weight, weight)  # the verifier's own weight, loaded by speculators
    assert not norm.weight.requires_grad
    reference = transformers_norm(model_type, weight)
    for x in inputs():
        assert torch.equal(norm(x), reference(x)), x.dtype


def _fixed_upstream(algorithm: str, model_type: str) -> bool:
    # speculators 0.9.0 resolves Gemma3RMSNorm for these two, in the DFlash family only.
    return (
        algorithm == "dflash"
        and VERSION >= Version("0.9.0")
        and model_type in ("qwen3_5", "qwen3_5_text")
    )


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("model_type", ONE_PLUS_W)
def test_without_the_patch_speculators_uses_x_times_w(unpatched, verifiers, algorithm, model_type):
    path, weight = verifiers(model_type)
    model = build(algorithm, path)
    x = inputs()[0]
    right = transformers_norm(model_type, weight)(x)
    plain = transformers_norm("qwen3", weight)(x)  # x / rms(x) * w
    got = model.verifier_norm(x)
    if _fixed_upstream(algorithm, model_type):
        assert torch.equal(got, right)
    else:
        assert torch.equal(got, plain) and not torch.allclose(got, right)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("model_type", ["qwen3", "llama"])
def test_other_verifiers_keep_their_norm(patched, verifiers, algorithm, model_type):
    path, weight = verifiers(model_type)
    model = build(algorithm, path)
    assert type(model.verifier_norm).__name__ in ("LlamaRMSNorm", "Qwen3RMSNorm")
    x = inputs()[0]
    assert torch.equal(model.verifier_norm(x), transformers_norm("qwen3", weight)(x))


@pytest.mark.skipif(VERSION >= Version("0.6.0"), reason="DFlash has a verifier norm from 0.6.0")
def test_dflash_050_has_no_verifier_norm():
    from speculators.models.dflash.core import DFlashDraftModel

    assert "self.verifier_norm" not in inspect.getsource(DFlashDraftModel)


def test_changed_speculators_code_fails_closed(unpatched):
    from dataclasses import replace

    from speculators.models.eagle3.core import Eagle3DraftModel

    from speculators_hybrid.registry import Patcher, PatchError
    from speculators_hybrid.speculators_patches.verifier_norm import EAGLE3
    from speculators_hybrid.versions import installed

    original = vars(Eagle3DraftModel)["__init__"]
    stale = replace(EAGLE3, targets=(replace(EAGLE3.targets[0], fingerprints=("0" * 16,)),))
    with pytest.raises(PatchError, match="Eagle3DraftModel.__init__ in speculators"):
        Patcher(version_of=installed).apply([stale])
    assert vars(Eagle3DraftModel)["__init__"] is original
