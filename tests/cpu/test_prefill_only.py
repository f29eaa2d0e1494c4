"""prefill-only-extraction (`SPECULATORS_HYBRID_PREFILL_ONLY=1`, set by `launch` for hybrids): the
state layers reserve no spare block for a draft token, so the KV capacity is what the true bytes
allow, and any request that would decode is refused before the scheduler (vLLM's own
`MambaBase.get_kv_cache_spec` and `InputProcessor._validate_params`, patched)."""

from __future__ import annotations

import pytest
from conftest import NO_CHUNKED_PREFILL, engine_config

from speculators_hybrid import planning
from speculators_hybrid.models import write_config
from speculators_hybrid.vllm_patches import prefill_only

pytestmark = pytest.mark.shim_only  # a mode of the plugin (no diff in patches/vllm)
ENV = prefill_only.ENV
GIB20 = 20 * 2**30


class StateLayer:
    """What `MambaBase.get_kv_cache_spec` reads of its layer (a GDN layer's state)."""

    mamba_type = "gdn_attention"
    is_kv_cache_tp_replicated = False  # vLLM >= 0.33 reads it
    state_alignment = 1  # vLLM >= 0.34 reads it (MambaBase's default)

    def get_state_shape(self):
        return ((4, 1024), (8, 64, 64))

    def get_state_dtype(self):
        import torch

        return (torch.bfloat16, torch.bfloat16)


def spec_of(config):
    from vllm.model_executor.layers.mamba.abstract import MambaBase

    layer = StateLayer()  # the method bound to it, as `layer.get_kv_cache_spec` is in vLLM
    return vars(MambaBase)["get_kv_cache_spec"].__get__(layer, MambaBase)(config)


@pytest.mark.parametrize("on", [False, True])
def test_state_layers_drop_the_spare_block_only_when_asked(shim, monkeypatch, on):
    monkeypatch.setenv(ENV, "1" if on else "0")
    extracting = engine_config(preset="tiny", ids=(2, 5, 8), max_model_len=4096)
    assert spec_of(extracting).num_speculative_blocks == (0 if on else 1)
    assert prefill_only.speculative_blocks(extracting) == (0 if on else 1)
    plain = engine_config(preset="tiny", ids=None, max_model_len=4096)
    assert spec_of(plain).num_speculative_blocks == 0


def capacity(tmp_path, on: bool, monkeypatch) -> int:
    """KV tokens of the Qwen3.6-27B preset at 20 GiB, as the engine would plan them."""
    from vllm.v1.core.kv_cache_utils import get_max_concurrency_for_kv_cache_config

    monkeypatch.setenv(ENV, "1" if on else "0")
    folder = write_config(tmp_path / ("on" if on else "off"), "qwen3.6-27b")
    setup = planning.Setup(
        model=str(folder),
        max_model_len=8192,
        max_num_batched_tokens=16384,
        chunked_prefill=False if NO_CHUNKED_PREFILL else None,  # 0.22-0.23 refuse it
    )
    config = planning.engine_config(setup)
    kv = planning.plan(config, planning.layer_specs(config), GIB20)
    return int(get_max_concurrency_for_kv_cache_config(config, kv) * 8192)


@pytest.mark.full_tier  # the Qwen3.6-27B config twice
def test_capacity_is_what_the_true_bytes_allow(shim, monkeypatch, tmp_path):
    # the model's own state and KV per token as vLLM plans it without extraction (244,004 tokens
    # in 20 GiB at 8,192, test_qwen36_planning.py) + 4 ids x 5120 x bf16
    true_bytes = GIB20 // 244_004 + 40_960
    off, on = capacity(tmp_path, False, monkeypatch), capacity(tmp_path, True, monkeypatch)
    assert off < 0.93 * GIB20 / true_bytes  # the spare float32 state block: about 0.86x
    assert on >= 0.97 * GIB20 / true_bytes, (off, on)


def test_a_request_that_would_decode_is_refused(shim, monkeypatch):
    from vllm import SamplingParams

    tasks = ("generate",)
    config = engine_config(preset="tiny", ids=(2, 5, 8), max_model_len=4096)
    from vllm.v1.engine.input_processor import InputProcessor

    check = InputProcessor(config)  # as the front end builds it (no tokenizer here)
    monkeypatch.setenv(ENV, "1")
    check._validate_params(SamplingParams(max_tokens=1), tasks)
    with pytest.raises(ValueError, match=r"max_tokens=1, got 8"):
        check._validate_params(SamplingParams(max_tokens=8), tasks)
    monkeypatch.setenv(ENV, "0")  # the default: vLLM decides
    check._validate_params(SamplingParams(max_tokens=8), tasks)
