"""vLLM's own KV-cache planning for a model config, on the CPU (used by `doctor` and tests).

Everything here calls vLLM's real classes: `EngineArgs` builds the config, the platform's
hybrid block-size alignment sizes attention blocks against the Mamba/GDN state as it does
at GPU start-up, the extraction layer is vLLM's `CacheOnlyAttentionLayer`, and
`get_kv_cache_configs` plans the groups. Call `speculators_hybrid.cpu.prepare()` first.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any

from speculators_hybrid.extraction import extraction_args, speculators_default
from speculators_hybrid.vllm_patches import prefill_only, wide_hidden

GPU_DEFAULT_BLOCK = 16  # vLLM's default block size on CUDA before backend/hybrid alignment


@dataclass(frozen=True)
class Setup:
    model: str
    # speculators' default for a 64-layer target; None: no extraction
    layer_ids: tuple[int, ...] | None = tuple(speculators_default(64))
    tp: int = 1
    prefix_caching: bool = False
    max_model_len: int | None = 262144  # None: vLLM derives it from the config
    language_model_only: bool = True
    chunked_prefill: bool | None = None  # None: vLLM's default
    max_num_batched_tokens: int | None = None  # None: vLLM's default
    data_parallel_size: int = 1  # engine cores behind one front end (each plans alone)
    kv_transfer: str | None = None  # JSON of another kv-transfer config than the file one
    speculative: str | None = None  # JSON of a drafter's speculative config (no extraction)


def forget_model_classes() -> None:
    """Drop vLLM's cached model classes (its registry keeps each architecture's class in an
    lru_cache), so a plan made after turning the patches on or off sees the classes as they
    are now; a real engine loads them once, after the plugin."""
    from vllm.model_executor.models import registry

    clear = getattr(getattr(registry, "_try_load_model_cls", None), "cache_clear", None)
    if clear is not None:  # not the inspection cache: refilling it runs a subprocess
        clear()


def patches(on: bool, import_all: bool = False) -> list[Any]:
    """Our vLLM patches on (as in an engine with the plugin) or off, and vLLM's model classes
    made again to match; returns the patches selected. `import_all`: every target module
    imported now, as an engine's start has them (else each is patched when first imported)."""
    from speculators_hybrid.registry import PATCHER
    from speculators_hybrid.vllm_patches import PATCHES

    PATCHER.revert()
    if on:
        PATCHER.apply(PATCHES)
        if import_all:
            PATCHER.verify_all()
    forget_model_classes()  # the model class as the patches make it (or not)
    return list(PATCHER.selected)  # none after `revert` alone


def engine_config(setup: Setup) -> Any:
    from vllm.engine.arg_utils import EngineArgs

    extra = extraction_args(setup.layer_ids) if setup.layer_ids else {}
    if setup.speculative is not None:
        extra = {"speculative_config": json.loads(setup.speculative)}
    if extra and setup.kv_transfer is not None:
        extra["kv_transfer_config"] = json.loads(setup.kv_transfer)
    args = EngineArgs(
        model=setup.model,
        skip_tokenizer_init=True,
        max_model_len=setup.max_model_len,
        enable_prefix_caching=setup.prefix_caching,
        language_model_only=setup.language_model_only,
        enable_chunked_prefill=setup.chunked_prefill,
        max_num_batched_tokens=setup.max_num_batched_tokens,
        data_parallel_size=setup.data_parallel_size,
        **extra,
    )
    config = args.create_engine_config()
    if getattr(config.cache_config, "kv_cache_layout", "") is None:
        # 0.29+: the engine core resolves the layout from the workers' backends; FlashAttention
        # on a GPU resolves to NHD, the layout the hidden-states connectors ask for.
        config.cache_config.kv_cache_layout = "NHD"
    # Tensor parallelism changes only per-rank head counts here; no process group is needed.
    config.parallel_config.tensor_parallel_size = setup.tp
    return config


def align_for_gpu(config: Any) -> None:
    """Block sizes as a CUDA start-up with FlashAttention sets them after model load."""
    from vllm.platforms.interface import Platform
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend

    if config.model_config.is_hybrid:
        Platform._align_hybrid_block_size(config, FlashAttentionBackend)


def hidden_state_layer(config: Any) -> tuple[str, Any]:
    """vLLM's own extraction layer, built as `ExtractHiddenStatesModel` builds it."""
    return hidden_state_layers(config, wide=False)[0]


def hidden_state_layers(config: Any, wide: bool = True) -> list[tuple[str, Any]]:
    """vLLM's own extraction layer, built as `ExtractHiddenStatesModel` builds it, or (`wide`)
    the W slices of `hidden-states-wide-group` where that patch is applied and on for this
    config."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.models.extract_hidden_states import CacheOnlyAttentionLayer

    ids = config.speculative_config.draft_model_config.hf_config.eagle_aux_hidden_state_layer_ids
    n = config.model_config.get_total_num_hidden_layers()
    name, hidden = f"cache_only_layers.{n}", config.model_config.get_hidden_size()
    width = wide_width(config, hidden) if wide else 1
    names = [name] if width == 1 else [wide_hidden.slice_name(name, j) for j in range(width)]
    layers = []
    for each in names:
        config.compilation_config.static_forward_context.pop(each, None)
        with set_current_vllm_config(config):
            layer = CacheOnlyAttentionLayer(
                num_heads=len(ids), head_size=hidden // width, prefix=each
            )
        layers.append((each, layer))
    return layers


def wide_width(config: Any, hidden: int) -> int:
    """W of `hidden-states-wide-group` for this config, 1 where it does not apply."""
    from speculators_hybrid.registry import patcher

    if wide_hidden.PATCH.id not in patcher().applied() or not wide_hidden.enabled(config):
        return 1
    width = wide_hidden.group_width(model_layer_specs(config).values())
    return width if width > 1 and hidden % width == 0 else 1


ATTENTION_TYPES = frozenset({"full_attention", "attention"})
STATE_TYPES = frozenset({"linear_attention", "mamba", "conv"})  # conv: LFM2's short conv
BOTH_TYPES = frozenset({"hybrid"})  # Falcon-H1: attention and Mamba-2 side by side
NO_CACHE_TYPES = frozenset({"mlp", "moe"})  # Nemotron-H's MLP and MoE layers
PATTERN = {"*": "full_attention", "M": "mamba", "-": "mlp", "E": "moe"}  # hybrid_override_pattern
# vLLM's `mamba_type` of the state layers, by model type (Gated DeltaNet otherwise).
MAMBA_TYPES = {
    "nemotron_h": "mamba2",
    "granitemoehybrid": "mamba2",
    "falcon_h1": "mamba2",
    "jamba": "mamba1",
    "lfm2": "short_conv",
    "lfm2_moe": "short_conv",
    "zamba2": "mamba2",  # its "hybrid" layers: a shared block's attention + Mamba-2
}


def layer_kinds(text: Any) -> list[str]:
    """Per decoder layer: "attention", the state layers' vLLM `mamba_type`, "attention+" and
    that type (both in one layer: Falcon-H1), or "" (no cache: an MLP or MoE layer). From
    `layer_types` (transformers derives it for Nemotron-H from `hybrid_override_pattern`, for
    Jamba from its attention period), Jamba's `layers_block_type`, that pattern, else every
    layer full attention (dense)."""
    types = getattr(text, "layer_types", None) or getattr(text, "layers_block_type", None)
    if not types and getattr(text, "hybrid_override_pattern", None):
        types = [PATTERN.get(c, c) for c in text.hybrid_override_pattern]
    if not types:
        return ["attention"] * text.num_hidden_layers
    known = ATTENTION_TYPES | STATE_TYPES | BOTH_TYPES | NO_CACHE_TYPES
    unknown = sorted({str(t) for t in types if t not in known})
    if unknown:
        raise ValueError(f"doctor does not plan layers of type {unknown} yet")
    state = MAMBA_TYPES.get(getattr(text, "model_type", ""), "gdn_attention")
    kind = {**dict.fromkeys(ATTENTION_TYPES, "attention"), **dict.fromkeys(STATE_TYPES, state)}
    kind.update(dict.fromkeys(BOTH_TYPES, f"attention+{state}"))
    return [kind.get(t, "") for t in types]


def model_layer_specs(config: Any) -> dict[str, Any]:
    """Per-layer specs of the target's own layers, as its attention and state layers report
    them."""
    from vllm.model_executor.models import ModelRegistry
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

    model = config.model_config
    cache = config.cache_config
    kinds = layer_kinds(model.hf_text_config)
    specs: dict[str, Any] = {}
    mamba: dict[str, Any] = {}
    if any(k not in ("attention", "") for k in kinds):  # state layers (alone or beside attention)
        model_cls, _ = ModelRegistry.resolve_model_cls(model.architecture, model_config=model)
        mamba = dict(
            shapes=tuple(model_cls.get_mamba_state_shape_from_config(config)),
            dtypes=model_cls.get_mamba_state_dtype_from_config(config),
            block_size=cache.mamba_block_size,
            page_size_padded=cache.mamba_page_size_padded,
            mamba_cache_mode=cache.mamba_cache_mode,
            num_speculative_blocks=prefill_only.speculative_blocks(config),  # as the layers
        )
    for i, kind in enumerate(kinds):
        state = "" if kind == "attention" else kind.removeprefix("attention+")
        if kind == "attention" or state != kind:
            specs[f"model.layers.{i}.self_attn.attn"] = FullAttentionSpec(
                block_size=cache.block_size,
                num_kv_heads=model.get_num_kv_heads(config.parallel_config),
                head_size=model.get_head_size(),
                dtype=model.dtype,
            )
        if state:
            specs[f"model.layers.{i}.linear_attn"] = MambaSpec(**mamba, mamba_type=state)
    return specs


def layer_specs(config: Any, wide: bool = False) -> dict[str, Any]:
    """All per-layer KV-cache specs one GPU worker would report, extraction layer included:
    vLLM's one layer, or with `wide` the engine's layout (the W slices of
    `hidden-states-wide-group` where it applies; `doctor` plans that).

    Order as on the GPU: layers are built with the default block size, then aligned.
    """
    cache = config.cache_config
    cache.block_size = GPU_DEFAULT_BLOCK
    if cache.mamba_cache_mode == "align":
        cache.mamba_block_size = GPU_DEFAULT_BLOCK
    spec = config.speculative_config
    extracts = spec is not None and spec.method == "extract_hidden_states"
    extracted = hidden_state_layers(config, wide) if extracts else []
    drafts = draft_layers(config) if spec is not None and spec.method == "dflash" else []
    align_for_gpu(config)
    specs = model_layer_specs(config)
    for name, layer in extracted + drafts:
        specs[name] = layer.get_kv_cache_spec(config)
    backends = {name: layer.get_attn_backend() for name, layer in extracted}
    return marked_as_runner(config, specs, backends)


def marked_as_runner(config: Any, specs: dict[str, Any], backends: dict[str, Any]) -> dict:
    """vLLM 0.24-0.28's runner marks each attention spec with whether its backend reads KV
    pages by block stride (what lets the planner pad a page that does not divide); the
    target's and the drafter's layers run FlashAttention on a GPU, the others their own."""
    from dataclasses import replace

    from vllm.config import set_current_vllm_config
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend
    from vllm.v1.kv_cache_interface import AttentionSpec

    if "indexes_kv_by_block_stride" not in {f.name for f in fields(AttentionSpec)}:
        return specs
    marked = {}
    with set_current_vllm_config(config):
        for name, spec in specs.items():
            if isinstance(spec, AttentionSpec):
                strided = backends.get(name, FlashAttentionBackend).indexes_kv_by_block_stride()
                spec = replace(spec, indexes_kv_by_block_stride=strided)
            marked[name] = spec
    return marked


def draft_layers(config: Any) -> list[tuple[str, Any]]:
    """A DFlash drafter's attention layers: vLLM's `Attention`, with the heads, head size,
    sliding window and names its `qwen3_dflash` model gives them (layers numbered after the
    target's); the runner reports their specs beside the target's."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.attention import Attention
    from vllm.model_executor.models import qwen3_dflash

    draft = config.speculative_config.draft_model_config.hf_config
    tp = config.parallel_config.tensor_parallel_size
    heads = draft.num_attention_heads // tp
    kv_heads = max(1, draft.num_key_value_heads // tp)
    head_size = getattr(draft, "head_dim", None) or draft.hidden_size // draft.num_attention_heads
    resolve = getattr(qwen3_dflash, "_resolve_layer_attention", None)  # 0.25+: sliding layers
    first = config.model_config.get_num_layers(config.parallel_config)
    layers = []
    with set_current_vllm_config(config):
        for i in range(draft.num_hidden_layers):
            name = f"model.layers.{first + i}.self_attn.attn"
            config.compilation_config.static_forward_context.pop(name, None)
            layer = Attention(
                heads,
                head_size,
                head_size**-0.5,
                num_kv_heads=kv_heads,
                cache_config=config.cache_config,
                per_layer_sliding_window=resolve(draft, i)[0] if resolve else None,
                prefix=name,
            )
            layers.append((name, layer))
    return layers


def planner() -> Any:
    """vLLM's planning module: `kv_cache_planning` from 0.33, `kv_cache_utils` before."""
    try:
        from vllm.v1.core import kv_cache_planning

        return kv_cache_planning
    except ImportError:
        from vllm.v1.core import kv_cache_utils

        return kv_cache_utils


def plan(config: Any, specs: dict[str, Any], memory_bytes: int) -> Any:
    """One worker's KV-cache config, planned as the engine core plans it."""
    module = planner()
    if hasattr(module, "get_global_kv_cache_groups"):  # 0.33+: groups first, then configs
        groups = module.get_global_kv_cache_groups(config, [dict(specs)])
        return module.get_kv_cache_configs(config, [dict(specs)], [memory_bytes], groups)[0]
    return module.get_kv_cache_configs(config, [dict(specs)], [memory_bytes])[0]


def max_request_bytes(config: Any, kv_cache_config: Any) -> int:
    """Bytes vLLM's planner reserves for one request of `max_model_len` tokens."""
    groups = kv_cache_config.kv_cache_groups
    module = planner()
    if hasattr(module, "DefaultKVCacheConfigBuilder"):  # 0.33+: the builder comes first
        from vllm.v1.core.kv_cache_config_builder import get_kv_cache_config_builder

        builder = get_kv_cache_config_builder(config)
        return int(module._max_memory_usage_bytes_from_groups(builder, config, groups))
    return int(module._max_memory_usage_bytes_from_groups(config, groups))


def engine_scheduler(config: Any, kv_cache_config: Any) -> tuple[Any, Any]:
    """The scheduler and request maker the engine core builds for this plan (vLLM's classes)."""
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.core.kv_cache_utils import (
        generate_scheduler_kv_cache_config,
        get_request_block_hasher,
        init_none_hash,
        resolve_kv_cache_block_sizes,
    )
    from vllm.v1.structured_output import StructuredOutputManager

    kv = generate_scheduler_kv_cache_config([kv_cache_config])
    # What EngineCore._initialize_kv_caches does next, in vLLM 0.20.1-0.33.0:
    config.cache_config.num_gpu_blocks = kv.num_blocks
    # (a vLLM patched by patches/vllm picks it with its `engine_block_size`)
    pick = getattr(kv_cache_utils, "engine_block_size", None)
    groups = kv.kv_cache_groups
    config.cache_config.block_size = (
        pick(groups) if pick else min(g.kv_cache_spec.block_size for g in groups)
    )
    config.validate_block_size()
    block_size, hash_block_size = resolve_kv_cache_block_sizes(kv, config)
    scheduler = config.scheduler_config.get_scheduler_cls()(  # AsyncScheduler if async
        vllm_config=config,
        kv_cache_config=kv,
        structured_output_manager=StructuredOutputManager(config),
        block_size=block_size,
        hash_block_size=hash_block_size,
    )
    hash_fn = get_hash_fn_by_name(config.cache_config.prefix_caching_hash_algo)
    init_none_hash(hash_fn)
    hasher = get_request_block_hasher(hash_block_size, hash_fn)

    def request(req_id: str, prompt: list[int]) -> Any:
        from vllm import SamplingParams
        from vllm.v1.request import Request

        params = SamplingParams(max_tokens=1)
        params.update_from_generation_config({}, None)
        return Request(req_id, prompt, params, None, block_hasher=hasher)

    return scheduler, request


def prompts_done(scheduler: Any, scheduler_output: Any) -> list[str]:
    """The requests of a scheduled step whose prompt it completes (schedule() has already
    counted the step's tokens as computed): each samples a token in this step."""
    reqs = scheduler.requests
    return [
        r
        for r in scheduler_output.num_scheduled_tokens
        if reqs[r].num_computed_tokens >= reqs[r].num_prompt_tokens
    ]


def model_output(
    scheduler_output: Any, sampled: dict[str, int], saved: frozenset[str] = frozenset()
) -> Any:
    """What the model runner returns for a step: a token for each request whose prompt is done,
    and the finished requests whose connector save completed (their blocks may then be freed)."""
    from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput

    ids = list(scheduler_output.num_scheduled_tokens)
    extra: dict[str, Any] = {}
    if "req_id_to_index" in {f.name for f in fields(ModelRunnerOutput)}:
        extra["req_id_to_index"] = {r: i for i, r in enumerate(ids)}  # vLLM < 0.34
    return ModelRunnerOutput(
        req_ids=ids,
        sampled_token_ids=[[sampled[r]] if r in sampled else [] for r in ids],
        kv_connector_output=KVConnectorOutput(finished_sending=set(saved)) if saved else None,
        **extra,
    )
