"""Granite 4.0-H's layer types under the names transformers >= 5.13 gives them.

Why: transformers 5.13 renamed `GraniteMoeHybridConfig`'s layer types: a config.json's `mamba`
and `attention` load as `linear_attention` and `full_attention`. vLLM 0.20.0-0.25.1's
`GraniteMoeHybridModel` looks each layer's class up in `ALL_DECODER_LAYER_TYPES`, which has the
old names only, so no Granite 4.0-H model builds (`KeyError: 'linear_attention'`); vLLM 0.25.0
asks only for transformers >= 5.5.3, so a fresh install gets a renaming one.
How: `ALL_DECODER_LAYER_TYPES` is replaced by a copy that also maps `full_attention` to the
attention layer class and `linear_attention` to the Mamba one (the old names stay, for an older
transformers). It names the original in `__wrapped__`, so it fingerprints as vLLM's dict.
Upstream: vLLM 0.26.0 (the layer-type map knows both names).
"""

from __future__ import annotations

from typing import Any

from speculators_hybrid.registry import Patch, Target

MODULE = "vllm.model_executor.models.granitemoehybrid"
# transformers >= 5.13's name -> the name vLLM < 0.26 knows
RENAMED = {"full_attention": "attention", "linear_attention": "mamba"}


class LayerTypes(dict):
    """vLLM's layer-type map with the new names too; `__wrapped__` is the original."""

    __wrapped__: dict[str, Any]


def both_names(original: dict[str, Any]) -> LayerTypes:
    table = LayerTypes(original)
    table.update({new: original[old] for new, old in RENAMED.items()})
    table.__wrapped__ = original
    return table


PATCH = Patch(
    id="granite-layer-type-names",
    project="vllm",
    versions=">=0.20,<0.26",
    fixed_upstream="vLLM 0.26.0 (the layer-type map knows both names)",
    why=__doc__ or "",
    targets=(
        Target(
            MODULE,
            "ALL_DECODER_LAYER_TYPES",
            both_names,
            ("776d9cd109d240e0",),  # 0.20.0-0.25.1
            replaces=True,
        ),
    ),
)
