"""hs-connectors' fp8 files written by the plugin's writer, for hybrid targets (vLLM >= 0.20).

Why: speculators' `--hidden-states-backend fp8` names hs-connectors' `FP8HiddenStatesConnector`,
a subclass of vLLM's `ExampleHiddenStatesConnector` that overrides `_write_tensors`. On vLLM
< 0.22 vLLM's class has no `_write_tensors` (it writes bf16 in the forward, so the override never
runs) and one KV-cache group only: a hybrid target stops at start-up. On 0.22-0.23 vLLM refuses
chunked prefill for its own class by name, not for the subclass, which then reads a chunked
prompt's rows with one step's slot mapping. From 0.24 the override replaces the plugin's writer
(hidden-states-provenance): no provenance, no guard, the file written in place.
How: before vLLM builds its config, for extraction from a hybrid model, that connector is named
as vLLM's own with `hidden_states_format: fp8` in its extra config. The plugin then picks the
connector as for the `file` backend (its own before 0.24, vLLM's from 0.24), and either writer
encodes the file as hs-connectors does (its `quantize_tensor_to_fp8`: float8_e4m3fn
`hidden_states` and float32 per-token `hidden_states_scales`) once the guard has seen the rows.
speculators' `FP8Transfer` (train `--hidden-states-backend fp8`) reads them. Other targets keep
hs-connectors' class.
Upstream: none (hs-connectors 0.9.0's connector is written for one vLLM >= 0.22 writer).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from speculators_hybrid import backends
from speculators_hybrid.registry import Patch, Target
from speculators_hybrid.vllm_patches._targets import CONFIG, POST_INIT, is_hybrid_extraction

if TYPE_CHECKING:
    import torch

logger = logging.getLogger("vllm.speculators_hybrid")

FP8 = backends.BY_NAME["fp8"]
STOCK = backends.BY_NAME["file"].connector


def file_format(extra_config: Any) -> str | None:
    """The encoding the connector's extra config asks for: `fp8`, or None (as computed)."""
    value = extra_config(backends.FORMAT_KEY, None)
    if value in (None, "", backends.FP8_FORMAT):
        return value or None
    raise ValueError(
        f"kv_connector_extra_config['{backends.FORMAT_KEY}'] must be "
        f"'{backends.FP8_FORMAT}' or absent, got {value!r}"
    )


def encode(tensors: dict[str, torch.Tensor], fmt: str | None) -> dict[str, torch.Tensor]:
    """The tensors as the file holds them: unchanged, or hs-connectors' fp8 encoding."""
    if fmt != backends.FP8_FORMAT:
        return tensors
    from hs_connectors.fp8_utils import SCALES_KEY, quantize_tensor_to_fp8

    hidden, scales = quantize_tensor_to_fp8(tensors["hidden_states"])
    return {**tensors, "hidden_states": hidden, SCALES_KEY: scales}


def name_stock_fp8(config: Any) -> bool:
    """hs-connectors' fp8 connector on hybrid extraction: named as vLLM's own, writing fp8."""
    transfer = getattr(config, "kv_transfer_config", None)
    if transfer is None or not is_hybrid_extraction(config):
        return False
    named = {
        "kv_connector": transfer.kv_connector,
        "kv_connector_module_path": transfer.kv_connector_module_path,
    }
    if backends.of_transfer_config(named) is not FP8:
        return False
    transfer.kv_connector, transfer.kv_connector_module_path = STOCK, None
    transfer.kv_connector_extra_config[backends.FORMAT_KEY] = backends.FP8_FORMAT
    logger.info(
        "speculators-hybrid: hybrid target, %s.%s: the plugin's writer writes its fp8 files",
        FP8.module,
        FP8.connector,
    )
    return True


def _before_post_init(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    name_stock_fp8(instance)
    return wrapped(*args, **kwargs)


PATCH = Patch(
    id="hidden-states-fp8-files",
    project="vllm",
    versions=">=0.20",
    fixed_upstream="none (hs-connectors 0.9.0's fp8 connector overrides vLLM >= 0.22's writer)",
    why=__doc__ or "",
    targets=(
        Target(
            CONFIG,
            "VllmConfig.__post_init__",
            _before_post_init,
            # 0.20.0-0.20.2, 0.21.0 (keep-hma-for-extraction's), then 0.22+
            ("802c9999fd991f14", "ea59cc078b35dc5f", *POST_INIT),
        ),
    ),
)
