"""extraction-model-type-list (vLLM 0.20-0.21): vLLM's own config step refuses extraction from a
hybrid family by its model type's name; with the patch the six families whose classes get
EAGLE-3 auxiliary hidden states build an extraction config, other methods keep vLLM's refusal,
and reverting the shim brings vLLM's refusal back (its pydantic validator follows the class).

Every config here is vLLM's own EngineArgs -> VllmConfig on the CPU (test_extraction_input.build).
"""

from __future__ import annotations

import pytest
from conftest import needs, set_shim
from test_eagle3_families import FAMILIES, _forget_classes
from test_eagle3_families import _dir as _model
from test_extraction_input import build

from speculators_hybrid.vllm_patches.eagle3_model_types import MODEL_TYPES, REFUSAL

pytestmark = needs("extraction-model-type-list")
IDS = (1, 2, 4)
ONE_EACH = [f for f in FAMILIES if f in MODEL_TYPES]


def test_the_six_families_are_the_ones_the_patch_serves():
    assert sorted(ONE_EACH) == sorted(MODEL_TYPES)


@pytest.mark.parametrize("family", ONE_EACH)
def test_without_the_patch_vllm_refuses_the_model_type(no_shim, tmp_path, family):
    _forget_classes()
    with pytest.raises(ValueError) as err:
        build(_model(tmp_path, family), IDS)
    assert f"extract_hidden_states {REFUSAL}" in str(err.value)
    assert family in str(err.value)


@pytest.mark.parametrize("family", ONE_EACH)
def test_with_the_patch_the_config_builds(shim, tmp_path, family):
    _forget_classes()
    config = build(_model(tmp_path, family), IDS)
    spec = config.speculative_config
    assert spec.method == "extract_hidden_states"
    assert list(spec.draft_model_config.hf_config.eagle_aux_hidden_state_layer_ids) == list(IDS)


@pytest.mark.shim_only
def test_other_methods_keep_the_refusal(shim, tmp_path):
    from vllm.config.speculative import SpeculativeConfig

    spec = build(_model(tmp_path, "granitemoehybrid"), IDS).speculative_config
    spec.method = "eagle3"  # a drafter's run for this target: not what the patch serves
    with pytest.raises(ValueError, match=f"eagle3 {REFUSAL}"):
        SpeculativeConfig._verify_args(spec)


@pytest.mark.shim_only
def test_revert_brings_the_refusal_back_and_apply_lifts_it_again(tmp_path):
    model = _model(tmp_path, "jamba")
    try:
        for on in (True, False, True, False):
            set_shim(on)
            _forget_classes()
            if on:
                assert build(model, IDS).speculative_config is not None
            else:
                with pytest.raises(ValueError, match=f"extract_hidden_states {REFUSAL}"):
                    build(model, IDS)
    finally:
        set_shim(True)
        _forget_classes()
