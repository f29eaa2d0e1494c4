"""EAGLE-3 auxiliary hidden states for a hybrid family's vLLM class: the shared part.

A family patch (eagle3_granite.py, eagle3_nemotron_h.py) replaces two things in the family's
vLLM module, both as plain objects (`Target.replaces`), never as wrapt proxies:
- the decoder stack's `forward` (the class vLLM compiles with `support_torch_compile`, which
  swaps `type(self).forward.__code__`: a proxy would hand it the original's code, and the aux
  states would silently vanish under torch.compile) by one that, when aux layers are set,
  returns `(hidden, [aux...])` as vLLM's own EAGLE-3 models do;
- the `...ForCausalLM` class by a subclass with vLLM's `SupportsEagle3` (the runtime-checked
  protocol vLLM's model runner, `check-extraction-input` and `families.py` ask for), whose
  `set_aux_hidden_state_layers` sets the decoder stack's `aux_hidden_state_layers`.
Ids as for Qwen3.5: 0 = the embeddings as the first decoder layer sees them (a copy: the model
goes on to use that tensor), i = the residual stream after decoder layer i-1, n = the last,
before the final norm.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from itertools import islice
from typing import Any

ATTR = "aux_hidden_state_layers"


def layers_of(stack: Any) -> tuple[int, ...]:
    return getattr(stack, ATTR, ())


def add(aux: list[Any], layers: tuple[int, ...], index: int, state: Any) -> None:
    """Append the residual-stream `state` for id `index` if it is asked for."""
    if index in layers:
        aux.append(state.clone() if index == 0 else state)


def residual_forward(model: str, final_norm: str) -> Callable[..., Any]:
    """vLLM's `<model>.forward` for a decoder stack whose layers keep a separate residual (fused
    add-RMSNorm; Nemotron-H, LFM2, Jamba), returning `(hidden, aux)` when aux ids are set: id i
    is `hidden + residual` after layer i-1, id 0 a copy of the embeddings, the last id before
    `final_norm` (the stack's norm attribute). Without aux ids, vLLM's own computation."""

    def forward(
        self: Any,
        input_ids: Any,
        positions: Any,
        intermediate_tensors: Any = None,
        inputs_embeds: Any = None,
    ) -> Any:
        from vllm.distributed.parallel_state import get_pp_group
        from vllm.sequence import IntermediateTensors

        pp = get_pp_group()
        if pp.is_first_rank:
            embedded = inputs_embeds is not None
            hidden = inputs_embeds if embedded else self.embed_input_ids(input_ids)
            residual = None
        else:
            assert intermediate_tensors is not None
            hidden = intermediate_tensors["hidden_states"]
            residual = intermediate_tensors["residual"]
        wanted = layers_of(self)
        aux: list[Any] = []
        if pp.is_first_rank:
            add(aux, wanted, 0, hidden)
        for index, layer in enumerate(
            islice(self.layers, self.start_layer, self.end_layer), start=self.start_layer + 1
        ):
            hidden, residual = layer(positions=positions, hidden_states=hidden, residual=residual)
            if index in wanted:
                add(aux, wanted, index, hidden if residual is None else hidden + residual)
        if not pp.is_last_rank:
            return IntermediateTensors({"hidden_states": hidden, "residual": residual})
        hidden, _ = getattr(self, final_norm)(hidden, residual)
        return (hidden, aux) if aux else hidden

    forward.__doc__ = f"vLLM's `{model}.forward`, returning `(hidden, aux)` when aux ids are set."
    return forward


def replacing(func: Callable[..., Any]) -> Callable[[Any], Any]:
    """A `Target.replaces` factory: a fresh copy of `func` per install (vLLM rewrites the
    installed forward's `__code__` when it compiles), with `__wrapped__` = the original, so
    fingerprints and `inspect` see vLLM's code through it, as through a wrapt proxy."""

    def factory(original: Any) -> Any:
        new = types.FunctionType(
            func.__code__, func.__globals__, func.__name__, func.__defaults__, func.__closure__
        )
        new.__kwdefaults__ = func.__kwdefaults__
        new.__doc__ = func.__doc__
        new.__qualname__ = original.__qualname__
        new.__wrapped__ = original  # type: ignore[attr-defined]
        return new

    return factory


def eagle3_class(original: type) -> type:
    """`original` (a vLLM `...ForCausalLM` whose `model` is the decoder stack) with EAGLE-3
    auxiliary hidden states; same name and module, so logs and vLLM's registry read alike."""
    from vllm.model_executor.models.interfaces import SupportsEagle3

    def set_aux_hidden_state_layers(self: Any, layers: tuple[int, ...]) -> None:
        setattr(self.model, ATTR, tuple(layers))

    def get_eagle3_default_aux_hidden_state_layers(self: Any) -> tuple[int, ...]:
        n = len(self.model.layers)
        return (2, n // 2, n - 3)

    body = {
        "__module__": original.__module__,
        "__qualname__": original.__qualname__,
        "__doc__": original.__doc__,
        "set_aux_hidden_state_layers": set_aux_hidden_state_layers,
        "get_eagle3_default_aux_hidden_state_layers": get_eagle3_default_aux_hidden_state_layers,
        "get_eagle3_aux_hidden_state_layers": get_eagle3_default_aux_hidden_state_layers,
        "speculators_hybrid_eagle3": True,
    }
    return type(original.__name__, (original, SupportsEagle3), body)
