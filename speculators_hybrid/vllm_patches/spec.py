"""The hidden-state cache's KV-cache spec, and how it is sized beside hybrid groups."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from vllm.v1.kv_cache_interface import MLAAttentionSpec


@dataclass(frozen=True, kw_only=True)
class HiddenStatesCacheSpec(MLAAttentionSpec):
    """The extraction layer's cache: `num_kv_heads` extracted ids x `head_size` hidden size.

    Same bytes as vLLM's `MLAAttentionSpec` (no K/V factor); the class marks the layer so
    the KV-cache planner, which only sees specs, can give it a group of its own.
    """


def _as(cls: type, spec: MLAAttentionSpec) -> Any:
    return cls(**{f.name: getattr(spec, f.name) for f in fields(spec) if f.init})


def mark(spec: MLAAttentionSpec) -> HiddenStatesCacheSpec:
    return spec if isinstance(spec, HiddenStatesCacheSpec) else _as(HiddenStatesCacheSpec, spec)


def plain(spec: MLAAttentionSpec) -> MLAAttentionSpec:
    """The same spec as vLLM's own class, for code paths that look classes up exactly."""
    return spec if type(spec) is MLAAttentionSpec else _as(MLAAttentionSpec, spec)


def bytes_per_token(spec: MLAAttentionSpec) -> int:
    return replace(spec, block_size=1, page_size_padded=None).real_page_size_bytes


def fit_to_page(
    spec: HiddenStatesCacheSpec, page_bytes: int, base_block: int, divide: bool = True
) -> HiddenStatesCacheSpec:
    """The spec with a block size whose tokens fit one page of `page_bytes`, padded to it.

    Without `divide` (prefix caching off): as many tokens as fit. With it, the largest block
    size that also divides `base_block` (the engine's), so the scheduler's block (the groups'
    LCM), the hash block (their GCD) and the prefix-cache hit granularity stay the model's;
    the rest of the page is padding.
    """
    per_token = bytes_per_token(spec)
    most = page_bytes // per_token
    if most < 1:
        raise ValueError(
            f"speculators-hybrid: one token of hidden states ({per_token} bytes: "
            f"{spec.num_kv_heads} layer ids x hidden size {spec.head_size}) does not fit in one "
            f"KV-cache page of this model ({page_bytes} bytes). Extract fewer layer ids."
        )
    block = max(b for b in range(1, most + 1) if base_block % b == 0) if divide else most
    padded = page_bytes if block * per_token != page_bytes else None
    return replace(spec, block_size=block, page_size_padded=padded)  # type: ignore[call-arg]
