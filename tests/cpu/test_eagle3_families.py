"""granitemoehybrid-eagle3, nemotron_h-eagle3, falcon_h1-eagle3, lfm2-eagle3, jamba-eagle3,
lfm2_moe-eagle3, zamba2-eagle3:
vLLM's real classes get EAGLE-3 auxiliary hidden states (SupportsEagle3, as vLLM's model runner
and check-extraction-input ask), and the decoder stack's forward returns them at the ids Qwen3.5
uses (0 = embeddings, i = residual stream after layer i-1, n = last, pre-norm).

The forward runs vLLM's real decoder-stack class, built on the CPU from a tiny config, with its
own embeddings and final norm; its Mamba / conv / attention layers need GPU kernels and a forward
context, so each decoder layer is swapped for a small module with the same contract (what it
returns as hidden states and residual) and the expected ids are computed from those modules.
The numerical match with transformers runs on the GPU (tests/gpu/test_hybrid_families.py, for
Granite 4.0-H and Nemotron-H so far).

granite-layer-type-names (vLLM 0.22-0.25): vLLM's real `GraniteMoeHybridModel` builds from a
config with the layer-type names transformers >= 5.13 gives (`linear_attention`,
`full_attention`), each layer of the class its type names; without the patch it raises KeyError.
"""

from __future__ import annotations

import importlib
import json
from typing import Any

import pytest
import torch
from conftest import needs, set_shim
from test_layer_zero import distributed, kernel_names  # noqa: F401, F811  (fixtures)

from speculators_hybrid.vllm_patches import (
    eagle3_falcon_h1,
    eagle3_granite,
    eagle3_jamba,
    eagle3_lfm2,
    eagle3_lfm2_moe,
    eagle3_nemotron_h,
    eagle3_zamba2,
)

GRANITE: dict[str, Any] = {
    "architectures": ["GraniteMoeHybridForCausalLM"],
    "model_type": "granitemoehybrid",
    "num_hidden_layers": 4,
    "layer_types": ["mamba", "attention", "mamba", "mamba"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "shared_intermediate_size": 128,
    "num_local_experts": 0,
    "num_experts_per_tok": 0,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "mamba_n_heads": 8,
    "mamba_d_head": 16,
    "mamba_n_groups": 1,
    "mamba_d_state": 16,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_chunk_size": 64,
    "embedding_multiplier": 12.0,
    "residual_multiplier": 0.22,
    "attention_multiplier": 0.0078125,
    "logits_scaling": 8.0,
    "position_embedding_type": "nope",
    "vocab_size": 128,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": True,
    "torch_dtype": "float32",
}
NEMOTRON_H = {
    "architectures": ["NemotronHForCausalLM"],
    "model_type": "nemotron_h",
    "num_hidden_layers": 4,
    "hybrid_override_pattern": "M*M-",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "mamba_num_heads": 8,
    "mamba_head_dim": 16,
    "n_groups": 1,
    "ssm_state_size": 16,
    "conv_kernel": 4,
    "expand": 2,
    "chunk_size": 64,
    "mlp_hidden_act": "relu2",
    "vocab_size": 128,
    "max_position_embeddings": 1024,
    "torch_dtype": "float32",
}
FALCON_H1 = {
    "architectures": ["FalconH1ForCausalLM"],
    "model_type": "falcon_h1",
    "num_hidden_layers": 4,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "mamba_d_ssm": 128,
    "mamba_n_heads": 8,
    "mamba_d_head": 16,
    "mamba_n_groups": 1,
    "mamba_d_state": 16,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_chunk_size": 64,
    "embedding_multiplier": 5.0,
    "vocab_size": 128,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
}
LFM2 = {
    "architectures": ["Lfm2ForCausalLM"],
    "model_type": "lfm2",
    "num_hidden_layers": 4,
    "layer_types": ["conv", "full_attention", "conv", "conv"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "block_auto_adjust_ff_dim": False,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "conv_L_cache": 3,
    "conv_dim": 64,  # LFM2's released configs carry these (vLLM reads them)
    "block_dim": 64,
    "conv_bias": False,
    "vocab_size": 128,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": True,
    "torch_dtype": "float32",
}
JAMBA = {
    "architectures": ["JambaForCausalLM"],
    "model_type": "jamba",
    "num_hidden_layers": 4,
    "attn_layer_period": 4,
    "attn_layer_offset": 1,  # layers: mamba, attention, mamba, mamba
    "expert_layer_period": 2,
    "expert_layer_offset": 1,
    "num_experts": 1,  # a plain MLP in every layer
    "num_experts_per_tok": 1,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "mamba_d_state": 16,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_dt_rank": 8,
    "vocab_size": 128,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
}
LFM2_MOE = {
    "architectures": ["Lfm2MoeForCausalLM"],
    "model_type": "lfm2_moe",
    "num_hidden_layers": 4,
    "layer_types": ["conv", "full_attention", "conv", "conv"],
    "num_dense_layers": 2,  # layers 0-1 a dense MLP, 2-3 the routed experts
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "conv_L_cache": 3,
    "conv_bias": False,
    "vocab_size": 128,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": True,
    "torch_dtype": "float32",
}
ZAMBA2 = {
    "architectures": ["Zamba2ForCausalLM"],
    "model_type": "zamba2",
    "num_hidden_layers": 4,
    "layers_block_type": ["mamba", "hybrid", "mamba", "hybrid"],
    "num_mem_blocks": 1,  # both hybrid layers run the one shared attention + MLP block
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "mamba_d_state": 16,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "n_mamba_heads": 8,
    "mamba_ngroups": 1,
    "chunk_size": 64,
    "use_shared_attention_adapter": False,
    "use_mem_rope": True,
    "vocab_size": 128,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": True,
    "torch_dtype": "float32",
}
FAMILIES = {
    "granitemoehybrid": (eagle3_granite, GRANITE, "GraniteMoeHybridForCausalLM"),
    "nemotron_h": (eagle3_nemotron_h, NEMOTRON_H, "NemotronHForCausalLM"),
    "falcon_h1": (eagle3_falcon_h1, FALCON_H1, "FalconH1ForCausalLM"),
    "lfm2": (eagle3_lfm2, LFM2, "Lfm2ForCausalLM"),
    "lfm2_moe": (eagle3_lfm2_moe, LFM2_MOE, "Lfm2MoeForCausalLM"),
    "zamba2": (eagle3_zamba2, ZAMBA2, "Zamba2ForCausalLM"),
    "jamba": (eagle3_jamba, JAMBA, "JambaForCausalLM"),
}
# What a family's decoder layer takes and returns (StandIn): "stream" returns the residual
# stream as its hidden states (and an internal residual), "separate" keeps a separate residual
# (fused add-RMSNorm: the stream is hidden + residual), "alone" takes and returns the stream
# only (no residual argument); "keywords" as "alone", called as Zamba2's are (the stream, then
# the embeddings and positions by keyword).
STYLE = {
    "granitemoehybrid": "stream",
    "nemotron_h": "separate",
    "falcon_h1": "alone",
    "lfm2": "separate",
    "lfm2_moe": "separate",
    "jamba": "separate",
    "zamba2": "keywords",
}
IDS = (0, 1, 3, 4)


def _forget_classes() -> None:
    """vLLM's registry caches each architecture's class (lru_cache): switching the shim in one
    process must not leave the other state's class there."""
    from vllm.model_executor.models import registry

    registry._try_load_model_cls.cache_clear()
    registry._try_inspect_model_cls.cache_clear()


@pytest.fixture(autouse=True)
def fresh_classes():
    _forget_classes()
    yield
    _forget_classes()


def _params(family: str):
    module = FAMILIES[family][0]
    return pytest.param(family, marks=needs(module.PATCH.id), id=family)


CASES = [_params(f) for f in FAMILIES]


def _dir(tmp_path, family: str) -> str:
    (tmp_path / "config.json").write_text(json.dumps(FAMILIES[family][1]))
    return str(tmp_path)


class StandIn(torch.nn.Module):
    """A decoder layer's contract without its kernels (STYLE): Granite's layers return the
    residual stream as hidden states (the residual they return is internal); Nemotron-H's keep a
    separate residual, the stream being hidden + residual (LFM2's and Jamba's too); Falcon-H1's
    take and return the stream alone."""

    def __init__(self, index: int, hidden: int, style: str):
        super().__init__()
        gen = torch.Generator().manual_seed(index)
        self.weight = torch.randn(hidden, hidden, generator=gen) / hidden**0.5
        self.style = style

    def forward(self, positions, hidden_states, residual=None):
        if self.style == "separate":  # vLLM's fused add-RMSNorm convention
            stream = hidden_states if residual is None else hidden_states + residual
            residual = stream
            return torch.tanh(stream @ self.weight), residual
        out = hidden_states + torch.tanh(hidden_states @ self.weight)
        if self.style == "alone":
            assert residual is None
            return out
        return out, hidden_states

    def stream(self, x, residual):
        if self.style == "alone":
            out = self(None, x)
            return out, None, out
        hidden, residual = self(None, x, residual)
        return hidden, residual, (hidden + residual if self.style == "separate" else hidden)


class KeywordStandIn(StandIn):
    """Zamba2's layers: called with the stream, then the embeddings and positions by keyword;
    they return the stream alone."""

    def forward(self, hidden_states, original_hidden_states, positions):
        assert original_hidden_states is not None and positions is not None
        return hidden_states + torch.tanh(hidden_states @ self.weight)

    def stream(self, x, residual):
        out = self(x, x, torch.arange(len(x)))
        return out, None, out


def _stand_ins(family: str, count: int, hidden: int) -> list[StandIn]:
    kind = KeywordStandIn if STYLE[family] == "keywords" else StandIn
    return [kind(i, hidden, STYLE[family]) for i in range(count)]


def _built(tmp_path, family: str, on: bool):
    from test_extraction_input import build
    from vllm.config import set_current_vllm_config

    set_shim(on)
    try:
        config = build(_dir(tmp_path, family), IDS)
        module = importlib.import_module(FAMILIES[family][0].MODULE)
        cls = getattr(module, FAMILIES[family][2])
        with set_current_vllm_config(config):
            model = cls(vllm_config=config, prefix="")
    finally:
        set_shim(True)
    return model


@pytest.mark.shim_only  # switches the shim off to see vLLM's own class
@pytest.mark.parametrize("family", CASES)
def test_the_class_reports_eagle3_as_vllm_checks_it(shim, family):
    from vllm.model_executor.models import ModelRegistry
    from vllm.model_executor.models.interfaces import supports_eagle3

    patch, _, arch = FAMILIES[family]
    module = importlib.import_module(patch.MODULE)
    assert supports_eagle3(getattr(module, arch))
    assert supports_eagle3(ModelRegistry._try_load_model_cls(arch))  # vLLM's registry's class
    set_shim(False)
    try:
        assert not supports_eagle3(getattr(module, arch))  # vLLM's own class, restored
    finally:
        set_shim(True)
        _forget_classes()


@pytest.mark.parametrize("family", CASES)
def test_extraction_config_is_accepted(shim, tmp_path, family):
    from test_extraction_input import build

    config = build(_dir(tmp_path, family), IDS)
    ids = config.speculative_config.draft_model_config.hf_config.eagle_aux_hidden_state_layer_ids
    assert list(ids) == list(IDS)


@pytest.mark.parametrize("family", CASES)
def test_without_the_patch_check_extraction_input_refuses(no_shim, tmp_path, family):
    """check-extraction-input (which stays on) names the class and what it lacks."""
    from test_extraction_input import build

    from speculators_hybrid.plugin import PATCHER, vllm_patches

    ours = FAMILIES[family][0].PATCH.id
    PATCHER.apply([p for p in vllm_patches() if p.id != ours])
    _forget_classes()
    with pytest.raises(ValueError) as err:
        build(_dir(tmp_path, family), IDS)
    message = str(err.value)
    assert f"model class {FAMILIES[family][2]}" in message
    assert "does not implement vLLM's SupportsEagle3" in message


@pytest.fixture(scope="module", autouse=True)
def gelu_kernel_names():
    """As test_layer_zero's `kernel_names`: Zamba2's MLP (GeluAndMul) looks up vLLM's compiled
    gelu kernels when built on the CPU, which do not load here and are never run: define their
    names only."""
    missing = [n for n in ("gelu_and_mul", "gelu_tanh_and_mul") if not hasattr(torch.ops._C, n)]
    if not missing:
        yield None
        return
    lib = torch.library.Library("_C", "FRAGMENT")
    for name in missing:
        lib.define(f"{name}(Tensor! out, Tensor input) -> ()")
    yield lib


@pytest.fixture
def moe_group(distributed, monkeypatch):  # noqa: F811
    """vLLM's expert-parallel group (one rank): `distributed` builds the groups for a dense
    model, and vLLM's MoE blocks ask for it when built."""
    from vllm.distributed import parallel_state as ps

    if getattr(ps, "_EP", "absent") is None:
        monkeypatch.setattr(ps, "_EP", ps.get_tp_group())


# transformers >= 5.13's names for Granite's layer types (GRANITE's are the older ones)
NEW_NAMES = {"mamba": "linear_attention", "attention": "full_attention"}
RENAMED = [NEW_NAMES[kind] for kind in GRANITE["layer_types"]]


def _granite_stack(tmp_path, on: bool):
    """vLLM's GraniteMoeHybridModel from a config with the new names, with or without the shim
    (the config itself is built with it: without, check-extraction-input refuses Granite)."""
    from test_extraction_input import build
    from vllm.config import set_current_vllm_config

    (tmp_path / "config.json").write_text(json.dumps(GRANITE | {"layer_types": RENAMED}))
    set_shim(True)
    config = build(str(tmp_path), IDS)
    assert config.model_config.hf_config.layer_types == RENAMED  # as transformers reads them
    module = importlib.import_module(eagle3_granite.MODULE)
    set_shim(on)
    try:
        with set_current_vllm_config(config):
            return module, module.GraniteMoeHybridModel(vllm_config=config, prefix="model")
    finally:
        set_shim(True)


@needs("granite-layer-type-names")
def test_granite_builds_each_layer_from_the_new_type_names(shim, moe_group, tmp_path):
    module, stack = _granite_stack(tmp_path, on=True)
    attention = module.GraniteMoeHybridAttentionDecoderLayer
    mamba = module.GraniteMoeHybridMambaDecoderLayer
    expected = [attention if kind == "full_attention" else mamba for kind in RENAMED]
    assert [type(layer) for layer in stack.layers] == expected
    assert RENAMED.index("full_attention") == 1  # one attention layer, between Mamba ones


@pytest.mark.shim_only  # vLLM's own dict, without the patch
@needs("granite-layer-type-names")
def test_without_the_patch_granite_cannot_read_the_new_names(shim, moe_group, tmp_path):
    module = importlib.import_module(eagle3_granite.MODULE)
    ours = module.ALL_DECODER_LAYER_TYPES
    with pytest.raises(KeyError, match="linear_attention"):
        _granite_stack(tmp_path, on=False)
    set_shim(False)
    try:  # revert put vLLM's own dict back, the one our copy names
        assert ours.__wrapped__ is module.ALL_DECODER_LAYER_TYPES
        assert sorted(module.ALL_DECODER_LAYER_TYPES) == ["attention", "mamba"]
    finally:
        set_shim(True)


@pytest.mark.full_tier
@pytest.mark.parametrize("family", CASES)
def test_forward_returns_aux_states_at_the_ids(moe_group, tmp_path, family):
    model = _built(tmp_path, family, on=True)
    model.set_aux_hidden_state_layers(IDS)  # as vLLM's model runner calls it
    stack = model.model
    hidden = stack.config.hidden_size
    layers = _stand_ins(family, len(stack.layers), hidden)
    stack.layers = torch.nn.ModuleList(layers)
    for weight in stack.parameters():  # built with torch.empty: give them values
        torch.nn.init.normal_(weight)
    tokens = torch.tensor([3, 17, 42, 5, 99])
    with torch.no_grad():
        out, aux = stack.forward(tokens, torch.arange(5))
        emb = stack.embed_input_ids(tokens) * getattr(stack, "embedding_multiplier", 1.0)
        expected, x, residual = [emb.clone()], emb, None
        for layer in layers:
            x, residual, stream = layer.stream(x, residual)
            expected.append(stream)
    assert len(aux) == len(IDS)
    for got, index in zip(aux, IDS, strict=True):
        assert torch.allclose(got, expected[index], atol=1e-6), index
    assert not torch.allclose(out, expected[-1])  # the last output is after the final norm
    assert torch.allclose(aux[0], emb)  # id 0 the embeddings, not overwritten by layer 1


@pytest.mark.full_tier
@pytest.mark.parametrize("family", CASES)
def test_without_aux_layers_forward_returns_the_tensor_alone(moe_group, tmp_path, family):
    model = _built(tmp_path, family, on=True)
    stack = model.model
    stack.layers = torch.nn.ModuleList(
        _stand_ins(family, len(stack.layers), stack.config.hidden_size)
    )
    with torch.no_grad():
        out = stack.forward(torch.tensor([1, 2, 3]), torch.arange(3))
    assert isinstance(out, torch.Tensor) and out.shape == (3, stack.config.hidden_size)


# --- Against transformers' own model (LFM2, LFM2-MoE, Zamba2) -------------------------------
# Both sides run their real decoder layers (pre-norms, residual adds; vLLM's fused add-RMSNorm
# against transformers' plain adds; Zamba2's hybrid layers: the shared block on [stream,
# embeddings], its projection into the Mamba input) with the same norm and embedding weights;
# only the ops inside a layer (short conv, Mamba mixer, attention, dense MLP / routed experts,
# Zamba2's projection) are one shared stand-in each, as vLLM's kernels do not run on the CPU.
# So the ids are checked against what transformers calls the hidden states
# (`output_hidden_states`: [0] the embeddings, [i] the output of layer i-1), the last one
# against its last layer's output before the final norm.
# family -> transformers' config and model classes (by name: vLLM registers configs of its own
# for some model types with transformers' AutoConfig)
HF_CLASSES = {
    "lfm2": ("Lfm2Config", "Lfm2Model"),
    "lfm2_moe": ("Lfm2MoeConfig", "Lfm2MoeModel"),
    "zamba2": ("Zamba2Config", "Zamba2Model"),
}


class Op(torch.nn.Module):
    """One op of a layer, for both sides: tanh(x W), taking what each side passes."""

    def __init__(self, seed: int, hidden: int, kind: str, width: int | None = None):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        width = width or hidden  # Zamba2's shared attention reads [stream, embeddings]
        self.weight = torch.randn(width, hidden, generator=gen) / width**0.5
        # "conv": vLLM's ShortConv writes into `output`; "attention": transformers' returns a
        # pair; "pair": vLLM's linear layers return (out, bias)
        self.kind = kind

    def forward(self, *args, **kwargs):
        x = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        if self.kind == "conv" and len(args) == 2:  # vLLM's ShortConv(x, output)
            args[1].copy_(torch.tanh(x @ self.weight))
            return None
        out = torch.tanh(x @ self.weight)
        if self.kind == "pair" or (self.kind == "attention" and "position_embeddings" in kwargs):
            return out, None
        return out


def _wire_lfm2(vllm_stack, hf, hidden: int) -> None:
    hf.embedding_norm.weight.copy_(vllm_stack.embedding_norm.weight)
    for i, (mine, hf_layer) in enumerate(zip(vllm_stack.layers, hf.layers, strict=True)):
        hf_layer.operator_norm.weight.copy_(mine.operator_norm.weight)
        hf_layer.ffn_norm.weight.copy_(mine.ffn_norm.weight)
        attention = hasattr(mine, "self_attn")
        mixer = Op(2 * i, hidden, "attention" if attention else "conv")
        setattr(mine, "self_attn" if attention else "short_conv", mixer)
        setattr(hf_layer, "self_attn" if attention else "conv", mixer)
        mine.feed_forward = hf_layer.feed_forward = Op(2 * i + 1, hidden, "ffn")


def _wire_zamba2(vllm_stack, hf, hidden: int) -> None:
    hf.final_layernorm.weight.copy_(vllm_stack.final_layernorm.weight)
    hybrid = 0
    for i, (mine, hf_layer) in enumerate(zip(vllm_stack.layers, hf.layers, strict=True)):
        if hasattr(mine, "shared_transformer"):  # a hybrid layer: shared block, linear, Mamba
            block, hf_block = mine.shared_transformer, hf_layer.shared_transformer
            shared = hybrid % hf.config.num_mem_blocks  # the block both sides cycle to
            hybrid += 1
            for norm in ("input_layernorm", "pre_ff_layernorm"):
                getattr(hf_block, norm).weight.copy_(getattr(block, norm).weight)
            block.self_attn = hf_block.self_attn = Op(100 + shared, hidden, "attention", 2 * hidden)
            block.feed_forward = hf_block.feed_forward = Op(200 + shared, hidden, "ffn")
            mine.linear, hf_layer.linear = Op(3 * i, hidden, "pair"), Op(3 * i, hidden, "ffn")
            mine, hf_layer = mine.mamba_decoder, hf_layer.mamba_decoder
        hf_layer.input_layernorm.weight.copy_(mine.input_layernorm.weight)
        mine.mamba = hf_layer.mamba = Op(3 * i + 1, hidden, "mamba")


def _transformers_model(family: str, vllm_stack):
    import transformers

    fields = {k: v for k, v in FAMILIES[family][1].items() if k != "model_type"}
    config_class, model_class = (getattr(transformers, name) for name in HF_CLASSES[family])
    config = config_class(**fields)
    config._attn_implementation = "eager"
    hf = model_class(config).float().eval()
    with torch.no_grad():
        hf.embed_tokens.weight.copy_(vllm_stack.embed_tokens.weight)
        wire = _wire_zamba2 if family == "zamba2" else _wire_lfm2
        wire(vllm_stack, hf, config.hidden_size)
    return hf


@pytest.mark.full_tier
@pytest.mark.parametrize("family", [_params(f) for f in HF_CLASSES])
def test_aux_states_match_transformers_hidden_states(moe_group, tmp_path, family):
    model = _built(tmp_path, family, on=True)
    model.set_aux_hidden_state_layers(IDS)
    stack = model.model
    for weight in stack.parameters():  # random embeddings and norm weights (not all ones)
        torch.nn.init.normal_(weight)
    hf = _transformers_model(family, stack)
    last: list[torch.Tensor] = []
    hf.layers[-1].register_forward_hook(lambda mod, args, out: last.append(out))
    tokens = torch.tensor([3, 17, 42, 5, 99, 64, 1])
    with torch.no_grad():
        out, aux = stack.forward(tokens, torch.arange(len(tokens)))
        theirs = hf(input_ids=tokens[None], output_hidden_states=True)
    n = len(stack.layers)
    states = [s[0] for s in theirs.hidden_states]
    assert len(states) == n + 1
    expected = {i: states[i] for i in range(n)} | {n: last[0][0]}  # [n]: after the final norm
    diffs = [(got - expected[i]).abs().max().item() for got, i in zip(aux, IDS, strict=True)]
    print(f"{family}: ids {IDS}, max |vLLM aux - transformers| {diffs}")
    for got, index in zip(aux, IDS, strict=True):
        torch.testing.assert_close(got, expected[index], rtol=1e-5, atol=1e-5, msg=str(index))
    torch.testing.assert_close(out, theirs.last_hidden_state[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out, states[n], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(aux[-1], states[n])  # id n is before the final norm
