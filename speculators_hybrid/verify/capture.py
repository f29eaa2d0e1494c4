"""The model's own hidden states, by layer id, as vLLM defines the ids.

Id 0 is the embeddings' output (the input of decoder layer 0); id i (1..n) is the output of
decoder layer i-1, the residual stream, so id n is the last state BEFORE the final norm.
transformers' `output_hidden_states` is not used: its last entry is the state after the final
norm (transformers 5 replaces it with `last_hidden_state`). Forward hooks on the decoder layers
capture the pre-norm states instead.

One model in memory serves every pass: it is loaded in its checkpoint's dtype, and a pass in
another dtype casts each block (embeddings, every decoder layer, the final norm) just before it
runs and restores the stored parameters right after, so a float32 pass of a bf16 checkpoint
costs one layer's extra memory, not a float32 copy of the model.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
SAFETENSORS_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}


class ModelError(ValueError):
    """The model cannot be loaded or does not fit the files."""


def read_config(folder: str | Path) -> dict[str, Any]:
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise ModelError(f"{folder} has no config.json: give the model's folder (weights + config)")
    try:
        config = json.loads(path.read_text())
    except ValueError as exc:
        raise ModelError(f"{path} is not JSON: {exc}") from None
    if not isinstance(config, dict):
        raise ModelError(f"{path} holds no JSON object")
    return config


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's part of a config: `text_config` when there is one."""
    text = config.get("text_config")
    return text if isinstance(text, dict) else config


def load_model(folder: str | Path, device: str = "cpu") -> torch.nn.Module:
    """The checkpoint in its own dtype, eval mode, by its `architectures` class."""
    import importlib.util

    import transformers

    config = read_config(folder)
    names = config.get("architectures") or []
    cls = next((getattr(transformers, n) for n in names if hasattr(transformers, n)), None)
    if cls is None:
        cls = transformers.AutoModelForCausalLM
    options: dict[str, Any] = {"dtype": "auto"}
    if device != "cpu" and importlib.util.find_spec("accelerate"):
        options["device_map"] = device  # straight onto the GPU (transformers needs accelerate)
    try:
        return cls.from_pretrained(str(folder), **options).to(device).eval()
    except Exception as exc:  # noqa: BLE001 (missing weights, unknown architecture, no memory)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        message = f"cannot load {folder} with transformers: {type(exc).__name__}: {first}"
        raise ModelError(message) from None


def decoder_stack(model: torch.nn.Module) -> torch.nn.Module:
    """The module holding `layers` (a `...TextModel`), in causal-LM or multimodal layouts."""
    for path in ("model.language_model", "model", "language_model.model", "language_model", ""):
        module: Any = model
        for part in filter(None, path.split(".")):
            module = getattr(module, part, None)
        if module is not None and isinstance(getattr(module, "layers", None), torch.nn.ModuleList):
            return module
    raise ModelError(f"{type(model).__name__}: no decoder layer list found (model.layers)")


def num_layers(model: torch.nn.Module) -> int:
    return len(decoder_stack(model).layers)


def _blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """What a forward runs, block by block: embeddings, decoder layers, final norm."""
    stack = decoder_stack(model)
    embeddings = _first(stack, "embed_tokens", "embeddings")  # Nemotron-H: embeddings, norm_f
    parts = [embeddings, *stack.layers, _first(stack, "norm", "norm_f")]
    return [p for p in parts if p is not None]


def _first(module: torch.nn.Module, *names: str) -> torch.nn.Module | None:
    found = (getattr(module, name, None) for name in names)
    return next((m for m in found if isinstance(m, torch.nn.Module)), None)


@contextmanager
def run_in(model: torch.nn.Module, dtype: torch.dtype) -> Iterator[None]:
    """Run `model`'s blocks in `dtype`: each block's floating parameters are cast just before
    it runs and the stored ones put back right after (exact whichever way the cast goes)."""
    blocks = [b for b in _blocks(model) if any(p.dtype != dtype for p in _floats(b))]
    stored: dict[int, list[tuple[torch.nn.Parameter, torch.Tensor]]] = {}

    def cast(module: torch.nn.Module, *_: Any) -> None:
        kept = stored[id(module)] = []
        for p in _floats(module):
            if p.dtype != dtype:
                kept.append((p, p.data))
                p.data = p.data.to(dtype)

    def restore(module: torch.nn.Module, *_: Any) -> None:
        for p, data in stored.pop(id(module), []):
            p.data = data

    handles = []
    for block in blocks:
        handles.append(block.register_forward_pre_hook(cast))
        handles.append(block.register_forward_hook(restore, always_call=True))
    try:
        yield
    finally:
        for h in handles:
            h.remove()
        for module_id in list(stored):  # a pass interrupted inside a block
            for p, data in stored.pop(module_id):
                p.data = data


def _floats(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters a pass casts: 16- and 32-bit floats (quantized weights keep their own)."""
    return [p for p in module.parameters() if p.dtype in DTYPES.values()]


class _Enough(Exception):
    """Raised by a hook once every requested id is captured: the rest of the forward is skipped."""


@torch.no_grad()
def hidden_states(
    model: torch.nn.Module,
    token_ids: Sequence[int],
    layer_ids: Sequence[int],
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """[tokens, len(layer_ids), hidden] on the model's device, in the pass's dtype: one forward
    without cache (in `dtype`, default the model's own), the residual stream at each id."""
    layers = decoder_stack(model).layers
    n = len(layers)
    if not all(0 <= i <= n for i in layer_ids):
        raise ModelError(f"layer ids must be within [0, {n}]: {list(layer_ids)}")
    wanted, states = set(layer_ids), {}

    def keep(i: int, value: Any) -> None:
        if i in wanted:
            states[i] = value[0] if isinstance(value, tuple) else value
            if len(states) == len(wanted):
                raise _Enough

    def before_first(module: Any, args: tuple, kwargs: dict) -> None:
        keep(0, args[0] if args else kwargs["hidden_states"])

    def after(i: int) -> Any:
        return lambda module, args, output: keep(i + 1, output)

    handles = [layers[0].register_forward_pre_hook(before_first, with_kwargs=True)]
    handles += [layer.register_forward_hook(after(i)) for i, layer in enumerate(layers)]
    device = next(model.parameters()).device
    dtype = dtype or next(model.parameters()).dtype
    try:
        with run_in(model, dtype):
            model(input_ids=torch.tensor([list(token_ids)], device=device), use_cache=False)
    except _Enough:
        pass
    finally:
        for h in handles:
            h.remove()
    missing = wanted - set(states)
    if missing:
        raise ModelError(f"{type(model).__name__}: the forward never reached ids {sorted(missing)}")
    return torch.stack([states[i][0] for i in layer_ids], dim=1)
