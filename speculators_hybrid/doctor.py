"""`speculators-hybrid doctor`: vLLM's own KV-cache plan for hidden-state extraction, without
and with our patches, side by side. Runs on the CPU from a config directory alone.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import asdict, dataclass, field
from typing import Any

from speculators_hybrid import planning

GIB = 1 << 30


@dataclass
class Group:
    kind: str
    layers: int
    block_size: int
    page_bytes: int
    real_page_bytes: int


@dataclass
class Plan:
    shim: bool
    ok: bool
    error: str = ""
    patches: list[str] = field(default_factory=list)
    groups: list[Group] = field(default_factory=list)
    hma_enabled: bool = False
    connector: str = ""
    block_size: int = 0
    request_gib: float = 0.0
    capacity_tokens: int = 0


def _group(g: Any) -> Group:
    spec = g.kv_cache_spec
    real = getattr(spec, "real_page_size_bytes", spec.page_size_bytes)
    return Group(
        type(spec).__name__, len(g.layer_names), spec.block_size, spec.page_size_bytes, real
    )


def plan_once(setup: planning.Setup, memory_bytes: int, shim: bool) -> Plan:
    from vllm.v1.core.kv_cache_utils import get_max_concurrency_for_kv_cache_config

    from speculators_hybrid.plugin import PATCHER, vllm_patches

    PATCHER.revert()
    if shim:
        PATCHER.apply(vllm_patches())
    result = Plan(shim=shim, ok=False)
    try:
        config = planning.engine_config(setup)
        result.hma_enabled = not config.scheduler_config.disable_hybrid_kv_cache_manager
        result.connector = (
            config.kv_transfer_config.kv_connector if config.kv_transfer_config else ""
        )
        kv = planning.plan(config, planning.layer_specs(config), memory_bytes)
    except Exception as exc:  # vLLM's own start-up error is the finding
        result.error = f"{type(exc).__name__}: {exc}"
        return result
    finally:
        result.patches = [p.id for p in PATCHER.selected] if shim else []
    result.ok = True
    result.block_size = config.cache_config.block_size
    result.groups = [_group(g) for g in kv.kv_cache_groups]
    result.request_gib = planning.max_request_bytes(config, kv) / GIB
    concurrency = get_max_concurrency_for_kv_cache_config(config, kv)
    result.capacity_tokens = int(concurrency * config.model_config.max_model_len)
    return result


def run(
    model: str | None,
    ids: tuple[int, ...],
    tp: int,
    max_model_len: int,
    memory_gib: float,
    prefix_caching: bool,
    as_json: bool,
) -> int:
    from speculators_hybrid import cpu

    cpu.prepare()
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    if model is None:
        from speculators_hybrid.models import write_config

        model = str(write_config(tempfile.mkdtemp(prefix="spec-hybrid-demo-"), "qwen3.6-27b-like"))
    setup = planning.Setup(
        model=model,
        layer_ids=ids,
        tp=tp,
        prefix_caching=prefix_caching,
        max_model_len=max_model_len,
    )
    memory = int(memory_gib * GIB)
    plans = [plan_once(setup, memory, shim=False), plan_once(setup, memory, shim=True)]
    if as_json:
        print(
            json.dumps(
                {
                    "setup": asdict(setup),
                    "memory_gib": memory_gib,
                    "plans": [asdict(p) for p in plans],
                },
                indent=2,
            )
        )
    else:
        print(
            f"model {model}  ids {list(ids)}  tp {tp}  max_model_len {max_model_len}  "
            f"prefix caching {'on' if prefix_caching else 'off'}  KV memory {memory_gib:g} GiB"
        )
        for p in plans:
            _print_plan(p)
    return 0 if plans[1].ok else 1


def _print_plan(p: Plan) -> None:
    print()
    print(
        f"== {'with' if p.shim else 'without'} speculators-hybrid"
        + (f" (patches: {', '.join(p.patches) or 'none'})" if p.shim else "")
    )
    print(
        f"   hybrid KV cache manager: {'on' if p.hma_enabled else 'off'}; connector: {p.connector}"
    )
    if not p.ok:
        print(f"   vLLM start-up fails: {p.error}")
        return
    print(f"   {'group':<24}{'layers':>7}{'block':>8}{'page bytes':>12}{'used bytes':>12}")
    for g in p.groups:
        print(
            f"   {g.kind:<24}{g.layers:>7}{g.block_size:>8}"
            f"{g.page_bytes:>12}{g.real_page_bytes:>12}"
        )
    print(
        f"   engine block size {p.block_size}; "
        f"one max-length request needs {p.request_gib:.1f} GiB; "
        f"KV capacity {p.capacity_tokens:,} tokens"
    )
