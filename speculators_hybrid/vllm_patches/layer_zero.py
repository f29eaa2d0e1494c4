"""Layer id 0 is the embeddings, not a tensor later overwritten with layer n.

Why: vLLM collects auxiliary hidden states with `EagleModelMixin._maybe_add_hidden_state`,
called with index 0 before the first decoder layer and `i + 1` after layer i (so ids follow
HF's `hidden_states`: 0 = embeddings, i = output of layer i, n = last, pre-norm). For index 0
there is no residual yet and it appends the embedding tensor itself, not a copy. The first
decoder layer keeps that same tensor as its residual, and vLLM's `RMSNorm` (Llama, Qwen2,
Qwen3, ...) adds every layer into the residual in place (`fused_add_rms_norm`), so after the
final norm "id 0" holds the final pre-norm state: id 0 came back equal to id n (seen on an H200
with vLLM 0.20.1). The aliasing is in every release 0.20.0-0.34.0 (`EagleModelMixin`'s method is
unchanged in 0.34.0). Qwen3.5 / Qwen3-Next in `vllm/model_executor/models` use `GemmaRMSNorm`,
whose residual add is out of place there, so the alias is latent for them; a future in-place
kernel would expose it.
vLLM 0.34.0 on CUDA builds Qwen3.5 from a new module, `vllm.models.qwen3_5.nvidia.model` (other
platforms keep the classes patched here). Its norm adds in place (flashinfer), and its own
`Qwen3_5Model._maybe_add_hidden_state` copies a state taken without a residual: the upstream fix,
for that model only. Its text-only class sets the layers itself, so the patch leaves it alone;
its multimodal class sets them through `EagleModelMixin._set_aux_hidden_state_layers`, so the
patch's method runs on top of vLLM's and copies the (already copied) id 0 once more: same values,
one extra copy, only when id 0 is requested.
How: when the aux layers are set (`EagleModelMixin._set_aux_hidden_state_layers`, which
vLLM's `SupportsEagle3` default uses, and `Qwen3_5ForCausalLMBase.set_aux_hidden_state_layers`,
which sets them directly), each decoder module gets an instance method that calls vLLM's own
`_maybe_add_hidden_state` and copies a state taken without a residual. Per instance, because
torch.compile (Dynamo) inlines the original code of a wrapt-wrapped method and would skip a
class-level wrapper; a plain instance method is traced. Models built while the patch is on
keep the copy after it is reverted.
Upstream: none yet for `EagleModelMixin`; 0.34.0 fixes it in its NVIDIA Qwen3.5 model only.
"""

from __future__ import annotations

import types
from typing import Any

from speculators_hybrid.registry import Patch, Target

INTERFACES = "vllm.model_executor.models.interfaces"
QWEN3_5 = "vllm.model_executor.models.qwen3_5"
METHOD = "_maybe_add_hidden_state"


def add_hidden_state_copying_embeddings(
    self: Any, aux: list[Any], layer_idx: int, hidden_states: Any, residual: Any
) -> list[Any]:
    """vLLM's `_maybe_add_hidden_state`, with a state taken without a residual copied."""
    before = len(aux)
    aux = type(self)._maybe_add_hidden_state(self, aux, layer_idx, hidden_states, residual)
    if residual is None and len(aux) > before:
        aux[-1] = aux[-1].clone()  # the caller goes on to use this tensor as its residual
    return aux


def copy_embeddings(module: Any) -> None:
    """Give every `EagleModelMixin` in `module` (itself included) the copying method."""
    from vllm.model_executor.models.interfaces import EagleModelMixin

    found = module.modules() if hasattr(module, "modules") else [module]
    for part in found:
        if not isinstance(part, EagleModelMixin):
            continue
        current = vars(part).get(METHOD)
        if getattr(current, "__func__", None) is not add_hidden_state_copying_embeddings:
            setattr(part, METHOD, types.MethodType(add_hidden_state_copying_embeddings, part))


def _after_set_layers(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    result = wrapped(*args, **kwargs)
    copy_embeddings(instance)
    return result


PATCH = Patch(
    id="layer-zero-is-embeddings",
    project="vllm",
    versions=">=0.20",
    fixed_upstream="none yet",
    why=__doc__ or "",
    targets=(
        Target(
            INTERFACES,
            "EagleModelMixin._set_aux_hidden_state_layers",
            _after_set_layers,
            ("eff100be7c387dd9", "54590fdc3934f89b"),  # 0.20.0-0.29.0, 0.30.0-0.34.0
        ),
        Target(
            QWEN3_5,
            "Qwen3_5ForCausalLMBase.set_aux_hidden_state_layers",
            _after_set_layers,
            ("445fa3c254ff474d",),  # 0.20.0-0.34.0
        ),
    ),
)
