"""The hidden states in one KV-cache group as wide as the model's (vLLM < 0.22, caching off).

Why: `hidden-states-own-page-size` splits every KV-cache group into one-layer groups so the
one-layer hidden-state group does not pay for W - 1 unused pages per block (W = the width
vLLM gives the model's groups, 16 for Qwen3.6-27B's 48 GDN + 16 attention layers). The
model runner then does block tables, slot mappings and attention metadata for 65 groups
instead of 4 + 1 every step. Side by side at that size, W layers run closer to plain prefill
than one layer, with bit-identical files and slightly fewer KV tokens (whole W-page blocks;
benchmarks/results/README.md, the hidden states in one wide group).
How: the extraction model gets W cache-only layers instead of one, layer j storing the slice
`hidden_states[..., j*h/W:(j+1)*h/W]` (an `MLAAttentionSpec` of n_ids heads x h/W), named
`cache_only_layers.<n>.slice<j>`. W is computed as vLLM's planner computes the group size
(`_get_kv_cache_groups_uniform_page_size`: the fewest layers of one spec, or the most if that
is under 1.5x the fewest) from the target's layers, which are in the forward context when the
drafter is built (the proposer reads them there itself). `hidden-states-own-group` puts the W
layers into ONE group; `hidden-states-own-page-size` leaves the groups as vLLM makes them when
that group is as wide as the model's (only the hidden block is refitted to the page), so the
plan has 4 + 1 groups; were the widths to differ, it splits as before (correct, slower). The
proposer accepts W layers of one group; our connector gathers the same slots from the W caches
and concatenates them: the same [tokens, n_ids, h] tensor and file. A non-hybrid target, or h
not divisible by W (logged), keeps the one layer.
When: on where prefix caching is off (vLLM 0.20-0.21's default for hybrid models); with prefix
caching on the hidden block must divide the engine block, and whole W-page blocks would cost a
large share of the KV tokens (tests/cpu/test_wide_hidden.py measures it), so one layer stays.
`SPECULATORS_HYBRID_WIDE_HIDDEN=1` forces W layers, `=0` one layer.
Upstream: none (vLLM >= 0.22 plans its own hidden-state group); remove with vLLM < 0.22.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable
from typing import Any

from speculators_hybrid import switches
from speculators_hybrid.registry import Patch, Target, argument

logger = logging.getLogger("vllm.speculators_hybrid")

SLICE = "speculators_hybrid_slice"  # attribute of each cache-only layer: (j, W)
WIDTH = "_speculators_hybrid_width"  # attribute of a widened ExtractHiddenStatesModel

MODELS = "vllm.model_executor.models.extract_hidden_states"
PROPOSER = "vllm.v1.spec_decode.extract_hidden_states"


def enabled(vllm_config: Any) -> bool:
    """W layers for this engine: as `SPECULATORS_HYBRID_WIDE_HIDDEN` says where set, else
    where prefix caching is off."""
    if switches.on(switches.WIDE_HIDDEN):
        return True
    if switches.off(switches.WIDE_HIDDEN):
        return False
    cache = getattr(vllm_config, "cache_config", None)
    return not getattr(cache, "enable_prefix_caching", False)


def group_width(specs: Iterable[Any]) -> int:
    """The layers per KV-cache group vLLM's planner makes for these layer specs (hybrid
    targets); 1 where it plans otherwise (no Mamba/GDN state: one uniform group)."""
    from vllm.v1.kv_cache_interface import MambaSpec

    specs = list(specs)
    if not any(isinstance(s, MambaSpec) for s in specs):
        return 1
    counts = Counter(specs).values()
    fewest, most = min(counts), max(counts)
    return most if most < fewest * 1.5 else fewest


def target_width(vllm_config: Any) -> int:
    """`group_width` of the layers in the forward context now (the target's, before the
    drafter is built), each spec as the model runner collects it."""
    from vllm.config import get_layers_from_vllm_config
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase

    layers = get_layers_from_vllm_config(vllm_config, AttentionLayerBase)  # type: ignore[type-abstract]
    specs = []
    try:
        for layer in layers.values():
            if getattr(layer, "kv_sharing_target_layer_name", None):
                continue  # no cache of its own
            spec = layer.get_kv_cache_spec(vllm_config)
            if spec:
                specs.append(spec)
        return group_width(specs) if specs else 1
    except Exception as exc:  # noqa: BLE001 (one layer still works: today's split)
        logger.warning(
            "speculators-hybrid: the target's KV-cache specs could not be read (%s); the "
            "hidden states keep one layer (one-layer groups).",
            exc,
        )
        return 1


def slice_name(name: str, j: int) -> str:
    return f"{name}.slice{j}"  # one integer in the name, as vLLM's layer-index parser wants


def _init(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> None:
    vllm_config = kwargs["vllm_config"]
    if not enabled(vllm_config):
        return wrapped(*args, **kwargs)
    width = target_width(vllm_config)  # before our layers join the forward context
    wrapped(*args, **kwargs)
    hidden = instance.hidden_size
    if width > 1 and hidden % width:
        logger.info(
            "speculators-hybrid: hidden size %d is not divisible by the KV-cache group width "
            "%d; the hidden states keep one layer (one-layer groups).",
            hidden,
            width,
        )
        return None
    if width > 1:
        widen(instance, vllm_config, width)
    return None


def widen(model: Any, vllm_config: Any, width: int) -> None:
    """Replace the model's one cache-only layer by `width` layers of hidden/width each."""
    import torch.nn as nn
    from vllm.model_executor.models.extract_hidden_states import CacheOnlyAttentionLayer

    ((key, one),) = model.cache_only_layers.items()
    context = vllm_config.compilation_config.static_forward_context
    context.pop(one.layer_name, None)
    size = model.hidden_size // width
    layers = {}
    for j in range(width):  # inside the loader's current config, as the original layer
        layer = CacheOnlyAttentionLayer(
            num_heads=one.num_heads,
            head_size=size,
            cache_config=_cache_config(vllm_config),
            prefix=slice_name(one.layer_name, j),
        )
        setattr(layer, SLICE, (j, width))
        layers[f"{key}_slice{j}"] = layer
    model.cache_only_layers = nn.ModuleDict(layers)
    setattr(model, WIDTH, width)
    logger.info(
        "speculators-hybrid: hidden states in %d cache-only layers of %d x %d (one KV-cache "
        "group as wide as the model's; %s=0 keeps one layer)",
        width,
        one.num_heads,
        size,
        switches.WIDE_HIDDEN,
    )


def _cache_config(vllm_config: Any) -> Any:
    """As `ExtractHiddenStatesModel.__init__`: hidden states are never quantized."""
    from dataclasses import replace

    from vllm.utils.torch_utils import is_quantized_kv_cache

    cache = vllm_config.cache_config
    if cache is not None and is_quantized_kv_cache(cache.cache_dtype):
        cache = replace(cache, cache_dtype="auto")
    return cache


def _forward(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> None:
    width = getattr(instance, WIDTH, 1)
    if width == 1:
        return wrapped(*args, **kwargs)
    hidden_states = argument(args, kwargs, 0, "hidden_states")
    size = hidden_states.shape[-1] // width
    # In slice order; our connector reads after the last one (save_kv_layer of the last layer).
    for j, layer in enumerate(instance.cache_only_layers.values()):
        layer(hidden_states[..., j * size : (j + 1) * size])
    return None


def _load_model(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> None:
    """`ExtractHiddenStatesProposer.load_model`, accepting the W layers of a widened model
    (upstream asserts exactly one); unchanged when the switch is off."""
    if not enabled(instance.vllm_config):
        return wrapped(*args, **kwargs)
    from vllm.compilation.backends import set_model_tag
    from vllm.config import get_layers_from_vllm_config
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm.model_executor.model_loader import get_model

    base: Any = AttentionLayerBase
    target_names = set(get_layers_from_vllm_config(instance.vllm_config, base))
    draft_model_config = instance.vllm_config.speculative_config.draft_model_config
    with set_model_tag("extract_hidden_states"):
        instance.model = get_model(
            vllm_config=instance.vllm_config, model_config=draft_model_config
        )
    draft = {
        name: layer
        for name, layer in get_layers_from_vllm_config(instance.vllm_config, base).items()
        if name not in target_names
    }
    width = getattr(instance.model, WIDTH, 1)
    if len(draft) != width:
        raise AssertionError(
            f"ExtractHiddenStatesModel should have {width} attention layer(s), found {len(draft)}"
        )
    instance.attn_layer_names = list(draft)
    instance.attn_metadata_builder = instance._build_attn_metadata_builder(draft)
    return None


def _same_group(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> None:
    names = list(instance.attn_layer_names)
    if len(names) == 1:
        return wrapped(*args, **kwargs)
    kv_cache_config = argument(args, kwargs, 0, "kv_cache_config")
    holding = [g for g in kv_cache_config.kv_cache_groups if set(names) & set(g.layer_names)]
    if len(holding) != 1 or not set(names) <= set(holding[0].layer_names):
        raise AssertionError(
            f"the {len(names)} hidden-state layers must be in one KV-cache group; found them "
            f"in {len(holding)}"
        )
    return None


PATCH = Patch(
    id="hidden-states-wide-group",
    project="vllm",
    versions=">=0.20,<0.22",
    fixed_upstream="none",
    why=__doc__ or "",
    # Fingerprints: the same code in 0.20.0-0.20.2 and 0.21.0.
    targets=(
        Target(MODELS, "ExtractHiddenStatesModel.__init__", _init, ("b8df0f7fdbc5b59c",)),
        Target(MODELS, "ExtractHiddenStatesModel.forward", _forward, ("b53ff0f890f45683",)),
        Target(
            PROPOSER, "ExtractHiddenStatesProposer.load_model", _load_model, ("57461d14c9e96b27",)
        ),
        Target(
            PROPOSER,
            "ExtractHiddenStatesProposer.validate_same_kv_cache_group",
            _same_group,
            ("c59a3cac6e3e8c16",),
        ),
    ),
)
