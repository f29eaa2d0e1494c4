"""hybrid-extraction-on-model-runner-v1 (vLLM >= 0.29): which model runner a CUDA start picks.

vLLM's `VllmConfig.use_v2_model_runner` decides it in every process (GPU worker, scheduler).
Model Runner V2 needs Triton: a CUDA host has it, the CPU envs leave it out, so the test sets
the flag vLLM reads at import (`HAS_TRITON`, a property of the host) as on a CUDA host.
"""

from __future__ import annotations

import pytest
from conftest import engine_config, needs
from upstream_worker import without

from speculators_hybrid.vllm_patches.runner_v1 import FEATURE

pytestmark = needs("hybrid-extraction-on-model-runner-v1")

TINY_IDS = (1, 4, 5, 8)


@pytest.fixture
def cuda_host(monkeypatch):
    import vllm.config.vllm as config_module

    monkeypatch.setattr(config_module, "HAS_TRITON", True)
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    return monkeypatch


def test_hybrid_extraction_runs_on_v1_and_vllm_says_why(shim, cuda_host):
    config = engine_config(preset="tiny", ids=TINY_IDS, max_model_len=4096)
    assert config.use_v2_model_runner is False
    # vLLM logs "Model Runner V2 does not yet support <these>; using the V1 model runner"
    assert FEATURE in config._get_v2_model_runner_unsupported_features()


def test_the_same_hybrid_without_extraction_keeps_vllms_default(shim, cuda_host):
    assert engine_config(preset="tiny", ids=None, max_model_len=4096).use_v2_model_runner is True


def test_without_the_patch_hybrid_extraction_would_run_on_v2(shim, cuda_host):
    config = engine_config(preset="tiny", ids=TINY_IDS, max_model_len=4096)
    with without("hybrid-extraction-on-model-runner-v1"):
        assert config.use_v2_model_runner is True


def test_asking_for_v2_by_name_still_gets_v2(shim, cuda_host):
    import vllm.envs as envs

    cuda_host.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    if hasattr(envs, "disable_envs_cache"):
        envs.disable_envs_cache()
    assert (
        engine_config(preset="tiny", ids=TINY_IDS, max_model_len=4096).use_v2_model_runner is True
    )
