"""Text-only Qwen3.5 checkpoints (`qwen3_5_text`, `qwen3_5_moe_text`) on vLLM < 0.27.

Why: vLLM 0.20.0-0.26.x defines `Qwen3_5ForCausalLM` and `Qwen3_5MoeForCausalLM` in
`qwen3_5.py` but does not register them. The registry then swaps the `ForCausalLM` suffix for
`ForConditionalGeneration` (`_ModelRegistry._normalize_arch`) and builds the multimodal model,
whose processor rejects the text config ("Invalid type of HuggingFace config. Expected ...
Qwen3_5Config, but found ... Qwen3_5TextConfig") and whose weights sit under `language_model.`.
The unregistered classes are not servable either: not `IsHybrid` (no GDN state shapes, so no
hybrid page alignment), no M-RoPE positions (the checkpoint's `rope_parameters` keep
`mrope_section`, so vLLM's runner asks the model for them), no `model.language_model.` prefix
mapping (some text-only exports keep it), and the architecture gets no config hook (the
checkpoint's `mamba_ssm_dtype` is ignored).
How: a `Registration` (vLLM's plugin hook `ModelRegistry.register_model`) of both
architectures, pointing at subclasses of vLLM's classes built here on first use (the plugin
itself imports no model code). They add `IsHybrid` and `SupportsMRoPE` as vLLM's multimodal
Qwen3.5 class has them (GDN state shape, dtype and copy functions are that class's own), load
`model.language_model.*` and `model.*` weights alike and skip `mtp.*`. Both architectures also
get the multimodal ones' config hook. EAGLE-3 auxiliary hidden states come from vLLM's class.
Upstream: PR 50210 (vLLM 0.27.0) registers both architectures with the GDN hooks and the
config hook; 0.28.0 adds the `model.language_model.` mapping. 0.34.0 moves both entries to
`vllm.models.qwen3_5`: on CUDA a new NVIDIA implementation (`vllm.models.qwen3_5.nvidia.model`,
hybrid, M-RoPE and EAGLE-3, with the same mapping), elsewhere the classes of `qwen3_5.py`; both
still registered, so the registration stays retired.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from speculators_hybrid.model_registration import Registration

DENSE = "Qwen3_5ForCausalLM"
MOE = "Qwen3_5MoeForCausalLM"
# our class name -> (vLLM's text-only class it extends)
CLASSES = {"Qwen3_5TextForCausalLM": DENSE, "Qwen3_5MoeTextForCausalLM": MOE}

PATCH = Registration(
    id="qwen3_5-text-only-models",
    project="vllm",
    versions="<0.27",
    fixed_upstream="PR 50210 (vLLM 0.27.0); weight prefix mapping in 0.28.0",
    why=__doc__ or "",
    targets=(),
    models=tuple((arch, f"{__name__}:{ours}") for ours, arch in CLASSES.items()),
    configs=(
        (DENSE, "Qwen3_5ForConditionalGeneration"),
        (MOE, "Qwen3_5MoeForConditionalGeneration"),
    ),
)


@cache
def _build() -> dict[str, type]:
    import torch
    from vllm.model_executor.models import qwen3_5
    from vllm.model_executor.models.interfaces import IsHybrid, SupportsMRoPE
    from vllm.model_executor.models.utils import AutoWeightsLoader, WeightsMapper

    multimodal = qwen3_5.Qwen3_5ForConditionalGeneration

    class TextOnly:
        hf_to_vllm_mapper = WeightsMapper(
            orig_to_new_prefix={"model.language_model.": "model.", "mtp.": None}
        )

        @classmethod
        def get_mamba_state_dtype_from_config(cls, vllm_config: Any) -> Any:
            return multimodal.get_mamba_state_dtype_from_config(vllm_config)

        @classmethod
        def get_mamba_state_shape_from_config(cls, vllm_config: Any) -> Any:
            return multimodal.get_mamba_state_shape_from_config(vllm_config)

        @classmethod
        def get_mamba_state_copy_func(cls) -> Any:
            return multimodal.get_mamba_state_copy_func()

        def get_mrope_input_positions(
            self, input_tokens: list[int], mm_features: list[Any]
        ) -> tuple[Any, int]:
            # Text only: the three M-RoPE axes all carry the token position.
            positions = torch.arange(len(input_tokens), dtype=torch.long)
            return positions.unsqueeze(0).expand(3, -1), 0

        def load_weights(self, weights: Any) -> set[str]:
            return AutoWeightsLoader(self).load_weights(weights, mapper=self.hf_to_vllm_mapper)

    built = {}
    for name, arch in CLASSES.items():
        base = getattr(qwen3_5, arch)
        cls = type(name, (TextOnly, base, IsHybrid, SupportsMRoPE), {"__module__": __name__})
        cls.__qualname__ = name
        built[name] = cls
    return built


def __getattr__(name: str) -> type:
    """`module:Class` as vLLM's registry loads it: the classes are built on first access."""
    if name in CLASSES:
        return _build()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
