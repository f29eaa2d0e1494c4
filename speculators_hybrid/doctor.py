"""`speculators-hybrid doctor`: vLLM's own KV-cache plan for a target, side by side: serving
without extraction, extraction on stock vLLM, and extraction with our patches. Runs on the CPU
from a config directory alone. `--json` output is described in docs/doctor.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from speculators_hybrid import planning

GIB = 1 << 30
SCHEMA = 1
PLANS = ("no-extraction", "stock", "shim")
TITLES = {
    "no-extraction": "serving without extraction (stock vLLM)",
    "stock": "extraction, stock vLLM",
    "shim": "extraction with speculators-hybrid",
}


@dataclass
class Groups:
    """`count` KV-cache groups of one shape."""

    kind: str
    count: int
    layers: int
    block_size: int
    page_bytes: int
    real_page_bytes: int


@dataclass
class Plan:
    name: str
    ok: bool = False
    error: str = ""
    patches: list[str] = field(default_factory=list)
    groups: list[Groups] = field(default_factory=list)
    hma_enabled: bool = False
    connector: str = ""
    prefix_caching: bool = False
    block_size: int = 0
    request_bytes: int = 0
    capacity_tokens: int = 0


@dataclass
class PerToken:
    """True bytes, from the layers' own specs (no padding, no grouping)."""

    attention_bytes_per_token: int = 0
    attention_layers: int = 0
    state_bytes_per_request: int = 0
    state_layers: int = 0
    hidden_bytes_per_token: int = 0


def _groups(kv: Any) -> list[Groups]:
    shapes: Counter[tuple[str, int, int, int, int]] = Counter()
    for g in kv.kv_cache_groups:
        spec = g.kv_cache_spec
        real = getattr(spec, "real_page_size_bytes", spec.page_size_bytes)
        shapes[
            (type(spec).__name__, len(g.layer_names), spec.block_size, spec.page_size_bytes, real)
        ] += 1
    return [Groups(k, n, layers, b, p, r) for (k, layers, b, p, r), n in shapes.items()]


def per_token(specs: dict[str, Any]) -> PerToken:
    from vllm.v1.kv_cache_interface import AttentionSpec, MambaSpec

    from speculators_hybrid.vllm_patches.own_page import is_hidden
    from speculators_hybrid.vllm_patches.spec import bytes_per_token

    out = PerToken()
    for spec in specs.values():
        if is_hidden(spec):
            out.hidden_bytes_per_token += bytes_per_token(spec)
        elif isinstance(spec, MambaSpec):
            out.state_layers += 1
            out.state_bytes_per_request += spec.page_size_bytes
        elif isinstance(spec, AttentionSpec):
            out.attention_layers += 1
            out.attention_bytes_per_token += spec.real_page_size_bytes // spec.block_size
    return out


def plan_once(name: str, setup: planning.Setup, memory_bytes: int) -> tuple[Plan, Any, Any]:
    """One plan with vLLM's own code; returns it with the config and specs it used."""
    from vllm.v1.core.kv_cache_utils import get_max_concurrency_for_kv_cache_config

    from speculators_hybrid.plugin import PATCHER, vllm_patches

    PATCHER.revert()
    if name == "shim":
        PATCHER.apply(vllm_patches())
    result = Plan(name=name)
    config = specs = None
    try:
        config = planning.engine_config(setup)
        result.hma_enabled = not config.scheduler_config.disable_hybrid_kv_cache_manager
        transfer = config.kv_transfer_config
        result.connector = transfer.kv_connector if transfer else ""
        result.prefix_caching = bool(config.cache_config.enable_prefix_caching)
        specs = planning.layer_specs(config)
        kv = planning.plan(config, specs, memory_bytes)
    except Exception as exc:  # vLLM's own start-up error is the finding
        result.error = f"{type(exc).__name__}: {exc}"
        return result, config, specs
    finally:
        result.patches = [p.id for p in PATCHER.selected] if name == "shim" else []
    result.ok = True
    result.block_size = config.cache_config.block_size
    result.groups = _groups(kv)
    result.request_bytes = planning.max_request_bytes(config, kv)
    concurrency = get_max_concurrency_for_kv_cache_config(config, kv)
    result.capacity_tokens = int(concurrency * config.model_config.max_model_len)
    return result, config, specs


def default_ids(model: str) -> tuple[int, ...]:
    """speculators' default target layer ids for this model: [2, n//2, n-3, n]."""
    from speculators_hybrid.launcher.target import load

    n = load(model).num_layers
    return (2, n // 2, n - 3, n)


def warnings_for(setup: planning.Setup, model: str, plans: dict[str, Plan]) -> list[str]:
    from speculators_hybrid.launcher.adjust import id_problems
    from speculators_hybrid.launcher.target import load

    out = []
    n = load(model).num_layers
    problems = id_problems(list(setup.layer_ids or ()), n)
    if problems:
        out.append(
            f"layer ids {list(setup.layer_ids or ())}: {'; '.join(problems)} (n = {n}); "
            "extraction would fail or write wrong files."
        )
    if setup.chunked_prefill is False:
        out.append("this vLLM refuses chunked prefill with the connector: planned without it.")
    shim = plans["shim"]
    if setup.prefix_caching and shim.ok and not shim.prefix_caching:
        out.append("prefix caching was asked for and is turned off for hybrid extraction here.")
    if setup.tp > 1:
        out.append(
            f"TP {setup.tp}: pages shrink with the KV heads and state per rank; hidden states "
            "are not sharded, so each rank holds all of them (block sizes above are per rank)."
        )
    return out


def _refuses_chunked(version: str | None) -> bool:
    """vLLM 0.22-0.23 refuse the hidden-states connector with chunked prefill (`launch` too)."""
    from packaging.version import Version

    from speculators_hybrid.launcher.adjust import STOCK_REFUSES_CHUNKED
    from speculators_hybrid.registry import base_version

    first, fixed = STOCK_REFUSES_CHUNKED
    return version is not None and first <= Version(str(base_version(version))) < fixed


def report(
    model: str,
    ids: tuple[int, ...] | None,
    tp: int,
    max_model_len: int,
    memory_gib: float,
    prefix_caching: bool,
) -> dict[str, Any]:
    from speculators_hybrid import __version__
    from speculators_hybrid.versions import installed

    ids = ids or default_ids(model)
    setup = planning.Setup(
        model=model,
        layer_ids=ids,
        tp=tp,
        prefix_caching=prefix_caching,
        max_model_len=max_model_len,
        chunked_prefill=False if _refuses_chunked(installed("vllm")) else None,
    )
    memory = int(memory_gib * GIB)
    plans: dict[str, Plan] = {}
    plans["no-extraction"], _, _ = plan_once(
        "no-extraction", planning.Setup(**{**asdict(setup), "layer_ids": None}), memory
    )
    plans["stock"], _, _ = plan_once("stock", setup, memory)
    plans["shim"], _, specs = plan_once("shim", setup, memory)
    bytes_ = per_token(specs) if specs else PerToken()
    base = plans["no-extraction"].request_bytes
    target = base + bytes_.hidden_bytes_per_token * max_model_len
    return {
        "schema": SCHEMA,
        "speculators_hybrid_version": __version__,
        "vllm_version": installed("vllm"),
        "setup": asdict(setup),
        "memory_gib": memory_gib,
        "bytes": asdict(bytes_),
        "request_target_bytes": target,
        "ratio_to_target": {
            k: (p.request_bytes / target if p.ok and target else None)
            for k, p in plans.items()
            if k != "no-extraction"
        },
        "plans": [asdict(plans[k]) for k in PLANS],
        "warnings": warnings_for(setup, model, plans),
    }


def run(
    model: str | None,
    ids: tuple[int, ...] | None,
    tp: int,
    max_model_len: int,
    memory_gib: float,
    prefix_caching: bool,
    as_json: bool,
) -> int:
    from speculators_hybrid import cpu

    if as_json:  # stdout is for the JSON alone: vLLM logs to stdout by default
        os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    cpu.prepare()
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    if model is None:
        from speculators_hybrid.models import write_config

        model = str(write_config(tempfile.mkdtemp(prefix="spec-hybrid-demo-"), "qwen3.6-27b-like"))
    with contextlib.redirect_stdout(sys.stderr if as_json else sys.stdout):
        out = report(model, ids, tp, max_model_len, memory_gib, prefix_caching)
    print(json.dumps(out, indent=2) if as_json else render(out))
    return 0 if out["plans"][-1]["ok"] else 1


def _on(flag: bool) -> str:
    return "on" if flag else "off"


def render(out: dict[str, Any]) -> str:
    s, b = out["setup"], out["bytes"]
    lines = [
        f"model {s['model']}  ids {list(s['layer_ids'])}  tp {s['tp']}  max_model_len "
        f"{s['max_model_len']:,}  prefix caching {_on(s['prefix_caching'])}  "
        f"KV memory {out['memory_gib']:g} GiB  vLLM {out['vllm_version']}",
        f"true bytes: attention {b['attention_bytes_per_token']:,}/token ({b['attention_layers']} "
        f"layers); state {b['state_bytes_per_request']:,}/request ({b['state_layers']} layers); "
        f"hidden states {b['hidden_bytes_per_token']:,}/token",
        f"target for one max-length request: no-extraction plan + hidden states = "
        f"{out['request_target_bytes'] / GIB:.1f} GiB",
    ]
    for p in out["plans"]:
        lines += ["", f"== {TITLES[p['name']]}"]
        if p["patches"]:
            lines.append(f"   patches: {', '.join(p['patches'])}")
        if p["name"] != "no-extraction":
            lines.append(
                f"   hybrid KV cache manager {_on(p['hma_enabled'])}; "
                f"connector {p['connector']}; prefix caching {_on(p['prefix_caching'])}"
            )
        if not p["ok"]:
            lines.append(f"   vLLM start-up fails: {p['error']}")
            continue
        lines.append(
            f"   {'groups':>6} {'x layers':>8}  {'kind':<24}{'block':>8}"
            f"{'page bytes':>12}{'used bytes':>12}"
        )
        for g in p["groups"]:
            lines.append(
                f"   {g['count']:>6} {g['layers']:>8}  {g['kind']:<24}{g['block_size']:>8}"
                f"{g['page_bytes']:>12,}{g['real_page_bytes']:>12,}"
            )
        ratio = out["ratio_to_target"].get(p["name"])
        lines.append(
            f"   engine block {p['block_size']}; one max-length request needs "
            f"{p['request_bytes'] / GIB:.1f} GiB"
            + (f" ({ratio:.2f}x target)" if ratio else "")
            + f"; KV capacity {p['capacity_tokens']:,} tokens"
        )
    lines += [f"warning: {w}" for w in out["warnings"]]
    return "\n".join(lines)
