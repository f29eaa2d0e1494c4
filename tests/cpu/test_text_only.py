"""qwen3_5-text-only-models: text-only Qwen3.5 checkpoints with vLLM's own config and planning code.

On vLLM < 0.27 the architectures come from our registration; from 0.27 vLLM registers them
itself and the registration retires (same assertions, vLLM's own classes). Against a vLLM source
patched by patches/vllm (SPECULATORS_HYBRID_PATCHED_VLLM=1) the classes are vLLM's too.
From 0.34.0 vLLM registers them in `vllm.models.qwen3_5`, which imports a new NVIDIA
implementation on CUDA and re-exports the classes of `vllm.model_executor.models.qwen3_5` on every
other platform (as here); the NVIDIA classes are checked directly, built on the CPU as well.
"""

from __future__ import annotations

import copy
import importlib
import json
from collections.abc import Iterator
from functools import cache

import pytest
from conftest import (
    MEMORY,
    NO_CHUNKED_PREFILL,
    NVIDIA_QWEN3_5,
    PATCHED_VLLM,
    PATCHER,
    VLLM,
    needs,
    nvidia_qwen3_5,
    scratch,
    vllm_patches,
)
from packaging.version import Version

from speculators_hybrid import launch, planning
from speculators_hybrid.model_registration import REGISTRAR, upstream_has
from speculators_hybrid.models import config_dict, text_config
from speculators_hybrid.vllm_patches import text_only

IDS = (2, 4, 5, 8)  # speculators' default for n = 8: [2, n//2, n-3, n]
HIDDEN = "cache_only_layers.8"
NEEDED = text_only.PATCH in PATCHER.select(vllm_patches())
OURS = NEEDED and not PATCHED_VLLM  # the classes are ours, not vLLM's own
# Tests that need the fix: everywhere, except a patched vLLM source without its diff.
fixed = needs(text_only.PATCH.id) if NEEDED else pytest.mark.skipif(False, reason="")
# Where vLLM registers Qwen3.5: from 0.34.0 a package choosing the implementation by platform.
REGISTERED_IN = (
    "vllm.models.qwen3_5" if VLLM >= Version("0.34") else "vllm.model_executor.models.qwen3_5"
)


def moe_config() -> dict:
    text = text_config("tiny")
    text.pop("intermediate_size")
    return {
        **text,
        "model_type": "qwen3_5_moe_text",
        "architectures": ["Qwen3_5MoeForCausalLM"],
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 128,
        "shared_expert_intermediate_size": 128,
    }


@cache
def model_dir(kind: str) -> str:
    folder = scratch(f"{kind}-")
    if kind == "moe":
        (folder / "config.json").write_text(json.dumps(moe_config()))
        return str(folder)
    config = config_dict("tiny", multimodal=kind == "multimodal")
    if kind == "ssm-fp32":  # as released Qwen3.5 checkpoints ship it
        config["mamba_ssm_dtype"] = "float32"
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


@cache
def _config(kind: str, language_model_only: bool):
    setup = planning.Setup(
        model=model_dir(kind),
        layer_ids=IDS,
        max_model_len=4096,
        language_model_only=language_model_only,
        chunked_prefill=False if NO_CHUNKED_PREFILL else None,
    )
    return planning.engine_config(setup)


def engine_config(kind: str = "text", language_model_only: bool = False):
    return copy.deepcopy(_config(kind, language_model_only))


def model_class(config):
    from vllm.model_executor.models import ModelRegistry

    model = config.model_config
    return ModelRegistry.resolve_model_cls(model.architectures, model_config=model)[0]


@pytest.fixture
def unregistered() -> Iterator[None]:
    REGISTRAR.revert()
    yield
    REGISTRAR.apply(PATCHER.select(vllm_patches()))


@pytest.mark.shim_only
def test_registered_by_us_only_where_vllm_lacks_it():
    import vllm.model_executor.models.config  # noqa: F401  (the config hook is added on import)
    from vllm.model_executor.models import ModelRegistry

    archs = [arch for arch, _ in text_only.PATCH.models]
    assert archs == ["Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM"]
    if NEEDED:
        assert REGISTRAR.added_by_us() >= set(archs)
        assert upstream_has(text_only.PATCH) == []
        assert text_only.PATCH.id in REGISTRAR.applied()
    else:  # retired: vLLM's own entries, untouched
        from vllm.model_executor.models import qwen3_5

        assert REGISTRAR.added_by_us() == set()
        assert upstream_has(text_only.PATCH) == archs
        for arch in archs:
            assert ModelRegistry.models[arch].module_name == REGISTERED_IN
            # On the CPU that is the class of qwen3_5.py (0.34.0: re-exported), as tests use.
            assert ModelRegistry.models[arch].load_model_cls() is getattr(qwen3_5, arch)


@pytest.mark.skipif(not NEEDED, reason="vLLM registers the text-only classes itself")
@pytest.mark.shim_only
def test_without_registration_vllm_builds_the_multimodal_model(unregistered):
    from vllm.multimodal import MULTIMODAL_REGISTRY

    config = planning.engine_config(
        planning.Setup(
            model=model_dir("text"),
            layer_ids=IDS,
            max_model_len=4096,
            language_model_only=False,
            chunked_prefill=False if NO_CHUNKED_PREFILL else None,
        )
    )
    assert model_class(config).__name__ == "Qwen3_5ForConditionalGeneration"
    assert config.model_config.is_multimodal_model
    # The error seen on the H200 (vLLM 0.20.1), raised by vLLM's own processor factory.
    with pytest.raises(TypeError, match="Expected type: .*Qwen3_5Config.*Qwen3_5TextConfig"):
        MULTIMODAL_REGISTRY.create_processor(config.model_config, tokenizer=object())


@fixed
@pytest.mark.parametrize("kind", ["text", "moe"])
@pytest.mark.parametrize("language_model_only", [False, True], ids=["plain", "lm-only"])
def test_engine_config_resolves_the_text_only_class(shim, kind, language_model_only):
    from vllm.model_executor.models import qwen3_5
    from vllm.model_executor.models.interfaces import (
        is_hybrid,
        supports_eagle3,
        supports_mrope,
        supports_multimodal,
    )

    config = engine_config(kind, language_model_only)
    cls = model_class(config)
    arch = "Qwen3_5ForCausalLM" if kind == "text" else "Qwen3_5MoeForCausalLM"
    assert config.model_config.architecture == arch
    expected = {"text": "Qwen3_5TextForCausalLM", "moe": "Qwen3_5MoeTextForCausalLM"}[kind]
    assert cls.__name__ == (expected if OURS else arch)
    assert issubclass(cls, getattr(qwen3_5, arch))
    assert is_hybrid(cls) and config.model_config.is_hybrid
    assert supports_eagle3(cls)
    # Not multimodal: vLLM builds no multimodal processor (the one that rejected the config).
    assert not supports_multimodal(cls) and config.model_config.multimodal_config is None
    # vLLM's runner asks the model for M-RoPE positions whenever the config uses M-RoPE.
    assert supports_mrope(cls) or not config.model_config.uses_mrope
    assert config.speculative_config.method == "extract_hidden_states"


@pytest.mark.skipif(not NEEDED, reason="vLLM's own class")
@fixed
def test_mrope_positions_are_the_token_positions():
    from vllm.model_executor.models import qwen3_5

    cls = text_only.Qwen3_5TextForCausalLM if OURS else qwen3_5.Qwen3_5ForCausalLM
    positions, delta = cls.get_mrope_input_positions(None, list(range(100, 107)), [])
    assert positions.shape == (3, 7) and delta == 0
    assert all(row.tolist() == list(range(7)) for row in positions)


@nvidia_qwen3_5
@pytest.mark.parametrize("kind", ["text", "moe"])
def test_cuda_class_has_what_the_registration_added(shim, kind):
    """On CUDA vLLM 0.34 builds the NVIDIA classes, not those the other tests resolve here:
    they are hybrid with the same GDN state, M-RoPE, EAGLE-3 and not multimodal, and map both
    checkpoint layouts (their loading: test_model_loads_a_transformers_checkpoint)."""
    from vllm.model_executor.models.interfaces import (
        is_hybrid,
        supports_eagle3,
        supports_mrope,
        supports_multimodal,
    )

    arch = "Qwen3_5ForCausalLM" if kind == "text" else "Qwen3_5MoeForCausalLM"
    cls = getattr(importlib.import_module(NVIDIA_QWEN3_5), arch)
    assert cls.__module__ == NVIDIA_QWEN3_5 and cls.__name__ == arch
    assert is_hybrid(cls) and supports_eagle3(cls) and supports_mrope(cls)
    assert not supports_multimodal(cls)
    config = engine_config(kind)
    planned = model_class(config)  # the class this host's vLLM (and our planning) uses
    assert planned is not cls
    for hook in ("get_mamba_state_shape_from_config", "get_mamba_state_dtype_from_config"):
        assert getattr(cls, hook)(config) == getattr(planned, hook)(config)
    positions, delta = cls.get_mrope_input_positions(None, list(range(100, 107)), [])
    assert positions.tolist() == [list(range(7))] * 3 and delta == 0
    mapper = cls.hf_to_vllm_mapper
    for prefix in ("model.language_model.", "model."):
        name = f"{prefix}layers.0.linear_attn.in_proj_qkv.weight"
        assert mapper._map_name(name) == "model.layers.0.linear_attn.in_proj_qkv.weight"
    assert mapper._map_name("lm_head.weight") == "lm_head.weight"
    assert mapper._map_name("mtp.layers.0.mlp.gate_proj.weight") is None


@fixed
def test_gdn_state_and_config_hook_match_the_multimodal_class(shim):
    config = engine_config("ssm-fp32")
    # The checkpoint's mamba_ssm_dtype reaches the cache config, as for the multimodal layout.
    assert config.cache_config.mamba_ssm_cache_dtype == "float32"
    mm = engine_config("multimodal", True)
    text = engine_config("text")
    text_cls, mm_cls = model_class(text), model_class(mm)
    assert text_cls.get_mamba_state_shape_from_config(
        text
    ) == mm_cls.get_mamba_state_shape_from_config(mm)
    assert text_cls.get_mamba_state_dtype_from_config(
        text
    ) == mm_cls.get_mamba_state_dtype_from_config(mm)


@pytest.mark.parametrize(
    "name",
    [
        "model.language_model.layers.0.linear_attn.in_proj_qkv.weight",
        "model.layers.0.linear_attn.in_proj_qkv.weight",
    ],
)
@fixed
def test_checkpoint_weight_names_map_to_the_text_model(name):
    from vllm.model_executor.models import qwen3_5

    if OURS:
        cls = text_only.Qwen3_5TextForCausalLM
    elif not hasattr(qwen3_5.Qwen3_5ForCausalLM, "hf_to_vllm_mapper"):
        pytest.skip("vLLM 0.27.x: no model.language_model. mapping (added in 0.28.0)")
    else:
        cls = qwen3_5.Qwen3_5ForCausalLM
    mapper = cls.hf_to_vllm_mapper
    assert mapper._map_name(name) == "model.layers.0.linear_attn.in_proj_qkv.weight"
    assert mapper._map_name("lm_head.weight") == "lm_head.weight"
    # vLLM 0.28.0's own mapper keeps mtp.* and its loader skips them (the loader test below)
    if OURS or "mtp." in mapper.orig_to_new_prefix:
        assert mapper._map_name("mtp.layers.0.mlp.gate_proj.weight") is None


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """vLLM's process groups for one CPU rank (model constructors ask for TP/PP ranks)."""
    from vllm.config import set_current_vllm_config
    from vllm.distributed import parallel_state as ps

    if ps.model_parallel_is_initialized():
        yield
        return
    init = tmp_path_factory.mktemp("dist") / "init"
    with set_current_vllm_config(engine_config()):
        ps.init_distributed_environment(1, 0, f"file://{init}", 0, "gloo")
        ps.initialize_model_parallel(1, 1)
    yield
    ps.destroy_model_parallel()
    ps.destroy_distributed_environment()


@pytest.fixture(scope="module")
def kernel_names() -> Iterator[None]:
    """From vLLM 0.26.0 SiluAndMul looks up `torch.ops._C.silu_and_mul` when built on the CPU;
    vLLM's compiled kernels do not load here and nothing here runs it: define its name only
    (as test_layer_zero.py does)."""
    import torch

    if hasattr(torch.ops._C, "silu_and_mul"):
        yield
        return
    lib = torch.library.Library("_C", "FRAGMENT")
    lib.define("silu_and_mul(Tensor! result, Tensor input) -> ()")
    yield
    del lib


@fixed
@pytest.mark.parametrize("prefix", ["model.", "model.language_model."])
@pytest.mark.parametrize("impl", ["registered", pytest.param("nvidia", marks=nvidia_qwen3_5)])
def test_model_loads_a_transformers_checkpoint(shim, one_rank, kernel_names, prefix, impl):
    """vLLM builds our class (or, patched or from 0.27, its own; `nvidia`: the class vLLM >= 0.34
    builds on CUDA) on the CPU and its loader takes every parameter from what transformers'
    `Qwen3_5ForCausalLM` saves, also in the `model.language_model.` layout some text-only exports
    keep; `mtp.` weights are skipped."""
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.models import qwen3_5

    mapped = OURS or hasattr(qwen3_5.Qwen3_5ForCausalLM, "hf_to_vllm_mapper")
    if prefix != "model." and not mapped:
        pytest.skip("vLLM 0.27.x: no model.language_model. mapping (added in 0.28.0)")
    config = engine_config()
    if impl == "nvidia":
        cls = importlib.import_module(NVIDIA_QWEN3_5).Qwen3_5ForCausalLM
    else:
        cls = model_class(config)
    with set_current_vllm_config(config), torch.device("cpu"):
        model = cls(vllm_config=config, prefix="")
    torch.manual_seed(0)
    hf = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**config_dict("tiny", multimodal=False)))
    saved = {
        k.replace("model.", prefix, 1): v.to(torch.bfloat16) for k, v in hf.state_dict().items()
    }
    saved["mtp.fc.weight"] = torch.zeros(4, 4, dtype=torch.bfloat16)
    loaded = model.load_weights(iter(saved.items()))
    assert loaded == {name for name, _ in model.named_parameters()}
    assert torch.equal(model.model.embed_tokens.weight, saved[f"{prefix}embed_tokens.weight"])
    assert torch.equal(model.model.norm.weight, saved[f"{prefix}norm.weight"])
    assert torch.equal(model.lm_head.weight, saved["lm_head.weight"])


def kv_groups(config) -> list[tuple]:
    specs = planning.layer_specs(config)
    kv = planning.plan(config, specs, MEMORY)
    return [
        (type(g.kv_cache_spec).__name__, g.kv_cache_spec.block_size, g.layer_names)
        for g in kv.kv_cache_groups
    ] + [kv.num_blocks]


@fixed
@pytest.mark.parametrize("kind", ["text", "moe"])
def test_kv_plan_has_the_hidden_state_group(shim, kind):
    groups = kv_groups(engine_config(kind))
    hidden = [g for g in groups[:-1] if HIDDEN in g[2]]
    assert len(hidden) == 1 and hidden[0][2] == [HIDDEN]
    assert "HiddenState" in hidden[0][0]
    assert {g[0] for g in groups[:-1]} >= {"MambaSpec", "FullAttentionSpec"}
    # The text-only checkpoint is planned exactly as the same model in the multimodal layout.
    if kind == "text":
        assert groups == kv_groups(engine_config("multimodal", True))


@fixed
def test_launch_dry_run_command_is_accepted_by_vllm(shim, capsys):
    from vllm.engine.arg_utils import EngineArgs

    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # older vLLM
        from vllm.utils import FlexibleArgumentParser  # type: ignore[no-redef]

    assert launch.main([model_dir("text"), "--dry-run"]) == 0
    cmd, dry_run = launch.plan([model_dir("text"), "--dry-run"])
    assert dry_run and "--language-model-only" not in cmd.argv
    assert launch.DRY_RUN_BANNER in capsys.readouterr().out
    model, *rest = cmd.argv[cmd.argv.index("serve") + 1 :]
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    args = parser.parse_args(["--model", model, "--max-model-len", "4096", *rest])
    config = EngineArgs.from_cli_args(args).create_engine_config()
    if getattr(config.cache_config, "kv_cache_layout", "") is None:  # 0.29+: engine core sets it
        config.cache_config.kv_cache_layout = "NHD"
    assert config.model_config.architecture == "Qwen3_5ForCausalLM"
    assert config.model_config.is_hybrid and not config.model_config.is_multimodal_model
    ids = config.speculative_config.draft_model_config.hf_config.eagle_aux_hidden_state_layer_ids
    assert list(ids) == list(IDS)
    assert [g for g in kv_groups(config)[:-1] if g[2] == [HIDDEN]]
