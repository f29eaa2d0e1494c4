"""`verifier-logit-scale` against speculators' real models: which verifiers get a scaled head,
that it holds the verifier's own weight, and that the patch is idempotent and reverts.

The logits themselves (bit-equal to transformers' Granite and Falcon-H1 models) are checked in
test_family_verifiers.py (`test_patched_head_gives_the_models_logits_bit_for_bit`).
"""

from __future__ import annotations

import importlib

import pytest
import torch
from conftest import ALGORITHMS, VERSION
from packaging.version import Version
from tiny_models import FALCON_H1_05B_SCALES, GRANITE_H_TINY_SCALES, build

from speculators_hybrid.speculators_patches import PATCHER, PATCHES
from speculators_hybrid.speculators_patches.verifier_logit_scale import (
    PATCH,
    logit_scale,
    use_scaled_verifier_head,
)


def test_installed_release_selects_and_matches_every_target():
    assert PATCH in PATCHER.select(PATCHES)
    targets = PATCH.targets_for(PATCHER.version_of("speculators"))
    assert len(targets) == len(ALGORITHMS)  # 0.5.0: EAGLE-3 only (its DFlash has hard targets)
    for target in targets:
        PATCHER.verify(PATCH, target, importlib.import_module(target.module))


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"model_type": "granitemoehybrid", "logits_scaling": 6}, ("divide", 6.0)),
        ({"model_type": "granite", "logits_scaling": 16.0}, ("divide", 16.0)),
        ({"model_type": "granitemoe", "logits_scaling": 1.0}, None),
        ({"model_type": "granitemoeshared"}, None),  # transformers' default: 1
        ({"model_type": "falcon_h1", "lm_head_multiplier": 0.0390625}, ("multiply", 0.0390625)),
        ({"model_type": "falcon_h1", "lm_head_multiplier": 1}, None),
        ({"model_type": "falcon_h1"}, None),
        # the text model decides, and its own field (vLLM hands composites' logits to it)
        (
            {
                "model_type": "granite4_vision",
                "text_config": {"model_type": "granite4_vision_text", "logits_scaling": 8},
            },
            ("divide", 8.0),
        ),
        (
            {
                "model_type": "llava_next",
                "logits_scaling": 3,
                "text_config": {"model_type": "granite", "logits_scaling": 16},
            },
            ("divide", 16.0),
        ),
        ({"model_type": "llava_next", "text_config": {"model_type": "llama"}}, None),
        # other families' fields of the same names are not Granite's / Falcon-H1's
        ({"model_type": "hyperclovax", "logits_scaling": 0.125}, None),
        ({"model_type": "falcon_mamba", "lm_head_multiplier": 0.5}, None),
        ({"model_type": "nemotron_h"}, None),
        ({"model_type": "granite", "logits_scaling": 0}, None),  # refused, with a warning
    ],
)
def test_which_configs_are_scaled(config, expected):
    found = logit_scale(config)
    assert (found[1:] if found else None) == expected


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("model_type", ["qwen3", "llama"])
def test_other_verifiers_keep_a_plain_head(patched, verifiers, algorithm, model_type):
    path, _ = verifiers(model_type)
    model = build(algorithm, path)
    assert type(model.verifier_lm_head) is torch.nn.Linear


@pytest.fixture(scope="module")
def scaled(tmp_path_factory):
    """model_type -> a tiny Granite 4.0-H / Falcon-H1 checkpoint (released models' scales)."""
    import warnings

    from tiny_models import write_family

    root = tmp_path_factory.mktemp("scaled")
    made: dict[str, str] = {}

    def get(model_type: str) -> str:
        if model_type not in made:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                made[model_type] = write_family(root, model_type)[0]
        return made[model_type]

    return get


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("model_type", ["granitemoehybrid", "falcon_h1"])
def test_scaled_head_holds_the_verifiers_weight(patched, request, scaled, algorithm, model_type):
    from safetensors.torch import load_file

    if model_type == "falcon_h1" and VERSION < Version("0.6.0"):
        reason = "speculators 0.5.0 finds no model.norm.weight in a Falcon-H1 checkpoint"
        request.applymarker(pytest.mark.xfail(strict=True, reason=reason, raises=ValueError))

    path = scaled(model_type)
    model = build(algorithm, path)
    head = model.verifier_lm_head
    assert type(head).__name__ == "ScaledLogitsHead"
    assert isinstance(head, torch.nn.Linear)
    saved = load_file(f"{path}/model.safetensors")
    # Granite 4.0-H ties its lm_head to the embeddings (no lm_head.weight in the file)
    assert torch.equal(head.weight, saved.get("lm_head.weight", saved["model.embed_tokens.weight"]))
    assert not head.weight.requires_grad
    assert "verifier_lm_head.weight" in model.state_dict()
    x = torch.randn(3, head.in_features)
    bare = torch.nn.functional.linear(x, head.weight)
    if model_type == "granitemoehybrid":
        assert torch.equal(head(x), bare / GRANITE_H_TINY_SCALES["logits_scaling"])
    else:
        assert torch.equal(head(x), bare * FALCON_H1_05B_SCALES["lm_head_multiplier"])
    assert type(model.lm_head) is torch.nn.Linear  # the drafter's own head is not scaled
    assert torch.equal(model.lm_head(x), torch.nn.functional.linear(x, model.lm_head.weight))


def test_idempotent_and_revertible(scaled):
    path = scaled("granitemoehybrid")
    PATCHER.revert()
    try:
        first = PATCHER.apply(PATCHES)
        assert PATCHER.apply(PATCHES) == first and PATCH in first
        model = build(ALGORITHMS[0], path)
        head = model.verifier_lm_head
        assert type(head).__name__ == "ScaledLogitsHead"
        assert not use_scaled_verifier_head(model)  # already scaled: left as it is
        assert model.verifier_lm_head is head
        x = torch.randn(2, head.in_features)
        assert torch.equal(head(x), torch.nn.functional.linear(x, head.weight) / 6.0)
    finally:
        PATCHER.revert()
    assert type(build(ALGORITHMS[0], path).verifier_lm_head) is torch.nn.Linear
