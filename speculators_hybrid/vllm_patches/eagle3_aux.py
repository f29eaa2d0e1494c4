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
from typing import Any

ATTR = "aux_hidden_state_layers"


def layers_of(stack: Any) -> tuple[int, ...]:
    return getattr(stack, ATTR, ())


def add(aux: list[Any], layers: tuple[int, ...], index: int, state: Any) -> None:
    """Append the residual-stream `state` for id `index` if it is asked for."""
    if index in layers:
        aux.append(state.clone() if index == 0 else state)


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
