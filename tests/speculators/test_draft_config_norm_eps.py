"""`draft-config-norm-eps` against speculators' real draft-config builder: which configs get
which fields, that the builder's `AutoConfig` is its own again after every call, and revert.

The end-to-end check (the default draft config of a Nemotron-H / LFM2 verifier: the verifier's
eps, the model's logits) is in test_family_verifiers.py.
"""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest
from conftest import VERSION
from packaging.version import Version

from speculators_hybrid.speculators_patches import PATCHER, PATCHES
from speculators_hybrid.speculators_patches.draft_config_norm_eps import (
    PATCH,
    expose_draft_fields,
)

BUILT_IN_WHEEL = VERSION >= Version("0.8.0")  # 0.7.0: scripts/train.py, outside the wheel


def test_selected_where_the_wheel_builds_the_draft_config():
    assert (PATCH in PATCHER.select(PATCHES)) == BUILT_IN_WHEEL
    if BUILT_IN_WHEEL:
        for target in PATCH.targets:
            PATCHER.verify(PATCH, target, importlib.import_module(target.module))


def _config(model_type: str, **fields):
    return SimpleNamespace(model_type=model_type, **fields)


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (_config("nemotron_h", layer_norm_epsilon=1e-5), (1e-5, "silu")),
        (_config("lfm2", norm_eps=2e-5), (2e-5, "silu")),
        (_config("lfm2", norm_eps=2e-5, hidden_act="gelu"), (2e-5, "gelu")),
        (_config("lfm2_moe", norm_eps=3e-5), (3e-5, "silu")),
        (_config("nemotron_h", layer_norm_epsilon=1e-5, hidden_activation="gelu"), (1e-5, None)),
        (_config("nemotron_h", layer_norm_epsilon=1e-5, rms_norm_eps=3e-6), (3e-6, "silu")),
        (_config("llama", norm_eps=1e-5), (None, None)),  # not these families: left alone
        (_config("jamba", layer_norm_epsilon=1e-5), (None, None)),
        (_config("nemotron_h"), (None, "silu")),  # no eps to give: the builder still fails
    ],
)
def test_which_configs_get_which_fields(config, expected):
    expose_draft_fields(config)
    assert (getattr(config, "rms_norm_eps", None), getattr(config, "hidden_act", None)) == expected


def test_a_text_config_is_what_gets_them():
    text = _config("lfm2", norm_eps=1e-5)
    outer = SimpleNamespace(model_type="lfm2_vl", text_config=text)
    assert expose_draft_fields(outer)
    assert text.rms_norm_eps == 1e-5 and not hasattr(outer, "rms_norm_eps")


@pytest.mark.skipif(not BUILT_IN_WHEEL, reason="no draft-config builder in this wheel")
def test_the_builder_keeps_its_own_autoconfig(patched, tmp_path):
    import speculators.train.cli as cli

    real = vars(cli)["AutoConfig"]
    with pytest.raises(ValueError):  # no config: the call fails, the name is restored anyway
        cli.create_transformer_layer_config(str(tmp_path), 1, "llama", None, 0, [0])
    assert vars(cli)["AutoConfig"] is real


@pytest.mark.skipif(not BUILT_IN_WHEEL, reason="no draft-config builder in this wheel")
def test_revert_restores_the_builder(tmp_path):
    import speculators.train.cli as cli

    original = vars(cli)["create_transformer_layer_config"]
    PATCHER.revert()
    try:
        PATCHER.apply(PATCHES)
        assert vars(cli)["create_transformer_layer_config"] is not original
        assert PATCH.id in PATCHER.applied()
    finally:
        PATCHER.revert()
    assert vars(cli)["create_transformer_layer_config"] is original
