"""layer-zero-is-embeddings: vLLM's real model classes, built on the CPU (meta weights), collect
id 0 as a copy of the embeddings, also under torch.compile.

What overwrites id 0 on a GPU is the fused add-RMSNorm kernel updating the first layer's
residual, which is the very embedding tensor, in place; it does not run on the CPU, so the tests
apply that update (`residual.add_`) between vLLM's own collection calls, in the order
`Qwen3NextModel.forward` / `Qwen2Model.forward` make them.

vLLM 0.34.0 builds Qwen3.5 on CUDA from `vllm.models.qwen3_5.nvidia.model`, which copies id 0
itself; that module imports and its classes build on the CPU too, so its tests run here.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
import torch
from conftest import NVIDIA_QWEN3_5, PATCHED_VLLM, model_dir, needs, nvidia_qwen3_5, set_shim
from test_extraction_input import build as build_with_ids

from speculators_hybrid.vllm_patches.layer_zero import add_hidden_state_copying_embeddings

pytestmark = needs("layer-zero-is-embeddings")

IDS = (0, 4, 8)
QWEN3 = {  # a dense control: vLLM's Qwen3 uses RMSNorm, whose residual add is in place
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "num_hidden_layers": 8,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "vocab_size": 128,
    "max_position_embeddings": 1024,
    "torch_dtype": "bfloat16",
}


@pytest.fixture(scope="module")
def distributed(tmp_path_factory: pytest.TempPathFactory):
    """vLLM's process groups for one CPU rank (model constructors ask for TP/PP ranks)."""
    from vllm.config import set_current_vllm_config
    from vllm.distributed import parallel_state as ps

    if ps.model_parallel_is_initialized():  # an earlier test in this process set them up
        yield
        return
    config = build(model_dir("tiny"))
    init = tmp_path_factory.mktemp("dist") / "init"
    with set_current_vllm_config(config):
        ps.init_distributed_environment(1, 0, f"file://{init}", 0, "gloo")
        ps.initialize_model_parallel(1, 1)
    yield
    ps.destroy_model_parallel()
    ps.destroy_distributed_environment()


@pytest.fixture(scope="module", autouse=True)
def kernel_names():
    """vLLM 0.29.0's SiluAndMul looks up `torch.ops._C.silu_and_mul` when built on the CPU;
    vLLM's compiled kernels do not load here and nothing here runs it: define its name only."""
    if hasattr(torch.ops._C, "silu_and_mul"):
        yield None
        return
    lib = torch.library.Library("_C", "FRAGMENT")
    lib.define("silu_and_mul(Tensor! result, Tensor input) -> ()")
    yield lib


def build(model: str):
    return build_with_ids(model, IDS)


def qwen3_dir(tmp_path: Path) -> str:
    (tmp_path / "config.json").write_text(json.dumps(QWEN3))
    return str(tmp_path)


def language_model(config):
    """vLLM's own model class for the config (its language model), on the meta device."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.models import ModelRegistry

    model = config.model_config
    arch = "Qwen3_5ForCausalLM" if model.hf_config.model_type == "qwen3_5" else model.architecture
    cls, _ = ModelRegistry.resolve_model_cls([arch], model_config=model)
    with set_current_vllm_config(config), torch.device("meta"):
        return cls(vllm_config=config, prefix="model")


def collect(decoder, embeddings: torch.Tensor, layer_out: torch.Tensor) -> list[torch.Tensor]:
    """Id 0, then what decoder layer 0's in-place fused add-RMSNorm does to its residual (the
    embedding tensor itself), then id 8 (last layer's output + residual)."""
    hidden = embeddings * 1  # a fresh tensor, as `embed_input_ids` returns
    aux = decoder._maybe_add_hidden_state([], 0, hidden, None)
    residual = hidden  # `residual = hidden_states` in the first layer
    residual.add_(layer_out)
    decoder._maybe_add_hidden_state(aux, 8, layer_out, residual)
    return aux


@pytest.mark.full_tier
@pytest.mark.parametrize("preset", ["qwen3", "qwen3_5"])
def test_id_zero_stays_the_embeddings(shim, distributed, tmp_path, preset):
    config = build(qwen3_dir(tmp_path) if preset == "qwen3" else model_dir("tiny"))
    model = language_model(config)
    model.set_aux_hidden_state_layers(IDS)  # vLLM's method, as the model runner calls it
    decoder = model.model
    assert decoder.aux_hidden_state_layers == IDS
    assert decoder._maybe_add_hidden_state.__func__ is add_hidden_state_copying_embeddings
    emb = torch.randn(5, decoder.config.hidden_size)
    out = torch.randn_like(emb)
    aux = collect(decoder, emb, out)
    assert len(aux) == 2
    assert torch.equal(aux[0], emb)  # id 0: the embeddings
    assert torch.equal(aux[1], out + (emb + out))  # id 8: vLLM's own sum, unchanged


@pytest.mark.parametrize("preset", ["qwen3", "qwen3_5"])
def test_without_the_patch_id_zero_becomes_the_last_residual(
    no_shim, distributed, tmp_path, preset
):
    config = build(qwen3_dir(tmp_path) if preset == "qwen3" else model_dir("tiny"))
    model = language_model(config)
    model.set_aux_hidden_state_layers(IDS)
    decoder = model.model
    assert "_maybe_add_hidden_state" not in vars(decoder)
    emb = torch.randn(5, decoder.config.hidden_size)
    out = torch.randn_like(emb)
    aux = collect(decoder, emb, out)
    assert torch.equal(aux[0], emb + out)  # the residual after layer 0, not the embeddings
    assert not torch.equal(aux[0], emb)


@pytest.mark.parametrize("on", [True, False], ids=["patched", "stock"])
def test_torch_compile_keeps_each_behaviour(distributed, tmp_path, on):
    """vLLM compiles the decoder's forward with fullgraph=True. Compiled code keeps eager
    semantics, so stock vLLM loses id 0 there too; the patch's instance method is traced (a
    class-level wrapt wrapper would not be: Dynamo inlines the wrapped function instead)."""
    set_shim(on)
    try:
        model = language_model(build(qwen3_dir(tmp_path)))
        model.set_aux_hidden_state_layers(IDS)
    finally:
        set_shim(True)
    emb, out = torch.randn(5, 64), torch.randn(5, 64)
    torch._dynamo.reset()
    compiled = torch.compile(
        lambda e, o: collect(model.model, e, o), fullgraph=True, backend="aot_eager"
    )
    aux = compiled(emb, out)
    assert torch.equal(aux[0], emb if on else emb + out)
    assert torch.equal(aux[1], out + (emb + out))


def test_other_ids_and_later_ranks_are_vllms_own(shim, distributed, tmp_path):
    model = language_model(build(qwen3_dir(tmp_path)))
    model.set_aux_hidden_state_layers((2, 4))  # no id 0
    decoder = model.model
    hidden, residual = torch.randn(3, 64), torch.randn(3, 64)
    assert decoder._maybe_add_hidden_state([], 0, hidden, None) == []
    assert decoder._maybe_add_hidden_state([], 3, hidden, residual) == []
    (value,) = decoder._maybe_add_hidden_state([], 4, hidden, residual)
    assert torch.equal(value, hidden + residual)
    model.set_aux_hidden_state_layers((0, 2))
    (first,) = decoder._maybe_add_hidden_state([], 0, hidden, residual)  # PP rank > 0
    assert torch.equal(first, hidden + residual)


@nvidia_qwen3_5
@pytest.mark.parametrize(
    "name", ["Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration"], ids=["text", "multimodal"]
)
@pytest.mark.parametrize("on", [True, False], ids=["patched", "stock"])
def test_vllms_nvidia_qwen3_5_copies_id_zero_itself(distributed, name, on):
    """vLLM 0.34's CUDA Qwen3.5 copies id 0 in its own `_maybe_add_hidden_state` (its norm adds
    in place), so id 0 stays the embeddings with or without the patch. The patch reaches only the
    multimodal class (whose layers are set through `EagleModelMixin._set_aux_hidden_state_layers`)
    and adds its copy on top of vLLM's; the text-only class sets them itself and is left alone."""
    from vllm.config import set_current_vllm_config

    cls = getattr(importlib.import_module(NVIDIA_QWEN3_5), name)
    config = build(model_dir("tiny"))
    set_shim(on)
    try:
        with set_current_vllm_config(config), torch.device("meta"):
            model = cls(vllm_config=config, prefix="model")
        model.set_aux_hidden_state_layers(IDS)  # vLLM's method, as the model runner calls it
    finally:
        set_shim(True)
    decoder = getattr(model, "language_model", model).model
    assert type(decoder).__module__ == NVIDIA_QWEN3_5 and decoder.aux_hidden_state_layers == IDS
    ours = name == "Qwen3_5ForConditionalGeneration" and on and not PATCHED_VLLM
    method = vars(decoder).get("_maybe_add_hidden_state")
    assert getattr(method, "__func__", None) is (
        add_hidden_state_copying_embeddings if ours else None
    )
    emb = torch.randn(5, decoder.config.hidden_size)
    out = torch.randn_like(emb)
    aux = collect(decoder, emb, out)
    assert len(aux) == 2
    assert torch.equal(aux[0], emb)  # id 0: the embeddings, by vLLM's own copy
    assert torch.equal(aux[1], out + (emb + out))
