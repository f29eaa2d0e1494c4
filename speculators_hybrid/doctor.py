"""`speculators-hybrid doctor`: vLLM's own KV-cache plan for a target, side by side: serving
without extraction, extraction on stock vLLM, and extraction with our patches. Runs on the CPU
from a config directory alone. `--json` output is described in docs/doctor.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import tempfile
import textwrap
import warnings
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from typing import Any
from unittest.mock import patch

from speculators_hybrid import planning, support, switches
from speculators_hybrid.cpu import quiet_vllm, vllm_error
from speculators_hybrid.usage import refuse

GIB = 1 << 30
SCHEMA = 1
TARGET = 1.05  # the memory target: one max-length request <= 1.05x (docs/doctor.md)
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
    mamba_cache_mode: str = ""
    max_num_batched_tokens: int = 0
    align_note: str = ""  # align mode refused vLLM's default max_num_batched_tokens on this host
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

    from speculators_hybrid.vllm_patches._targets import is_hidden
    from speculators_hybrid.vllm_patches.spec import bytes_per_token

    out = PerToken()
    for spec in specs.values():
        if is_hidden(spec):
            out.hidden_bytes_per_token += bytes_per_token(spec)
        elif isinstance(spec, MambaSpec):
            out.state_layers += 1
            if getattr(spec, "page_size_padded", None) is not None:  # vLLM's own size, unpadded
                spec = replace(spec, page_size_padded=None)
            out.state_bytes_per_request += spec.page_size_bytes
        elif isinstance(spec, AttentionSpec):
            out.attention_layers += 1
            out.attention_bytes_per_token += spec.real_page_size_bytes // spec.block_size
    return out


def plan_once(name: str, setup: planning.Setup, memory_bytes: int) -> tuple[Plan, Any, Any]:
    """One plan with vLLM's own code; returns it with the config and specs it used."""
    from vllm.v1.core.kv_cache_utils import get_max_concurrency_for_kv_cache_config

    result = Plan(name=name)
    result.patches = [p.id for p in planning.patches(name == "shim")]
    config = specs = None
    try:
        config = planning.engine_config(setup)
        result.hma_enabled = not config.scheduler_config.disable_hybrid_kv_cache_manager
        transfer = config.kv_transfer_config
        result.connector = transfer.kv_connector if transfer else ""
        result.prefix_caching = bool(config.cache_config.enable_prefix_caching)
        specs = planning.layer_specs(config, wide=True)  # the layout the engine makes
        kv = planning.plan(config, specs, memory_bytes)
    except Exception as exc:  # vLLM's own start-up error is the finding
        result.error = vllm_error(exc)
        return result, config, specs
    from speculators_hybrid import align_mode

    result.block_size = config.cache_config.block_size
    align = align_mode.check_config(config, kv)  # vLLM's own start-up check of the block size
    result.mamba_cache_mode = align.mamba_cache_mode
    result.max_num_batched_tokens = align.max_num_batched_tokens
    if not align.ok and setup.max_num_batched_tokens is not None:
        result.error = align.message()
        return result, config, specs
    if not align.ok:  # the default here (CPU platform) is not a GPU's (2048, or 8192 at 70 GiB+)
        result.align_note = align.message()
    result.ok = True
    result.groups = _groups(kv)
    result.request_bytes = planning.max_request_bytes(config, kv)
    concurrency = get_max_concurrency_for_kv_cache_config(config, kv)
    result.capacity_tokens = int(concurrency * config.model_config.max_model_len)
    return result, config, specs


def preflight(target: Any, ids: tuple[int, ...] | None, tp: int) -> tuple[int, ...]:
    """The ids (speculators' default if none), after the checks `launch` makes, in well under a
    second and before vLLM is imported: the config, the ids, TP against the heads, the model
    family on this vLLM (speculators_hybrid/families.py). Raises LaunchError (one line)."""
    from speculators_hybrid import families
    from speculators_hybrid.extraction import speculators_default
    from speculators_hybrid.launcher import LaunchError
    from speculators_hybrid.launcher.adjust import check_layer_ids
    from speculators_hybrid.launcher.target import tp_error
    from speculators_hybrid.versions import installed

    ids = ids or tuple(speculators_default(target.num_layers))
    check_layer_ids(list(ids), target, "--ids")
    message = tp_error(target, tp)
    if message is not None:
        raise LaunchError(message)
    vllm = installed("vllm")
    message = families.refusal(target.model_type, vllm)
    if message is not None:
        raise LaunchError(message)
    if vllm is None:
        raise LaunchError(
            "doctor plans with vLLM's own code, and vLLM is not installed for this Python: "
            "install the release you serve with (pip install vllm==RELEASE)"
        )
    return ids


def wide_hidden_applies(shim: Plan) -> bool:
    """vllm_patches/wide_hidden.py would widen the hidden states for this plan (its releases,
    caching off, not switched off)."""
    from speculators_hybrid.versions import installed
    from speculators_hybrid.vllm_patches.wide_hidden import PATCH

    wanted = not shim.prefix_caching and not switches.off(switches.WIDE_HIDDEN)
    return wanted and PATCH.needed_for(installed("vllm"))


def warnings_for(setup: planning.Setup, plans: dict[str, Plan], hidden: int = 0) -> list[str]:
    out = []
    shim = plans["shim"]
    width = max((g.layers for g in plans["no-extraction"].groups), default=1)
    split = shim.ok and width > 1 and all(g.layers == 1 for g in shim.groups)
    if split and hidden % width and wide_hidden_applies(shim):  # it needs h / W whole
        groups = sum(g.count for g in shim.groups)
        wide = sum(g.count for g in plans["no-extraction"].groups) + 1
        out.append(
            f"hidden size {hidden:,} is not divisible by the KV-cache group width {width}: the "
            f"hidden states keep one layer and the plan has {groups} one-layer groups instead "
            f"of {wide} (the same files; more scheduler work per step)."
        )
    if setup.prefix_caching and shim.ok and not shim.prefix_caching:
        out.append("prefix caching was asked for and is turned off for hybrid extraction here.")
    if shim.align_note:
        out.append(
            f"at vLLM's default max_num_batched_tokens on this host: {shim.align_note}; on a GPU "
            "the default is 2048 (8192 from 70 GiB): pass --max-num-batched-tokens to check yours."
        )
    if setup.tp > 1:
        out.append(
            f"TP {setup.tp}: pages shrink with the KV heads and state per rank; hidden states "
            "are not sharded, so each rank holds all of them (block sizes above are per rank)."
        )
    return out


def report(
    model: str,
    ids: tuple[int, ...] | None,
    tp: int,
    max_model_len: int | None,
    memory_gib: float,
    prefix_caching: bool,
    max_num_batched_tokens: int | None = None,
) -> dict[str, Any]:
    from speculators_hybrid import __version__
    from speculators_hybrid.launcher.target import load
    from speculators_hybrid.versions import installed
    from speculators_hybrid.vllm_patches.prefix_caching import stock_refuses_chunked

    ids = ids or preflight(load(model), None, tp)
    setup = planning.Setup(
        model=model,
        layer_ids=ids,
        tp=tp,
        prefix_caching=prefix_caching,
        max_model_len=max_model_len,
        max_num_batched_tokens=max_num_batched_tokens,
    )
    memory = int(memory_gib * GIB)
    plans: dict[str, Plan] = {}
    plans["no-extraction"], plain_config, plain_specs = plan_once(
        "no-extraction", planning.Setup(**{**asdict(setup), "layer_ids": None}), memory
    )
    if plain_config is not None:  # vLLM's own max_model_len, derived from the config if not given
        setup = planning.Setup(
            **{**asdict(setup), "max_model_len": plain_config.model_config.max_model_len}
        )
    # Stock vLLM 0.22-0.23 refuse their connector with chunked prefill: plan it as it must run.
    stock = planning.Setup(**{**asdict(setup), "chunked_prefill": False})
    plans["stock"], _, _ = plan_once(
        "stock", stock if stock_refuses_chunked(installed("vllm")) else setup, memory
    )
    plans["shim"], _, specs = plan_once("shim", setup, memory)
    # True bytes from the layers' specs: the shim's plan, else the target's own layers (the
    # no-extraction plan's) and the extraction layer's size (ids x hidden size x dtype bytes).
    bytes_ = per_token(specs or plain_specs or {})
    if not specs and plain_config is not None:
        served = plain_config.model_config
        bytes_.hidden_bytes_per_token = len(ids) * served.get_hidden_size() * served.dtype.itemsize
    base = plans["no-extraction"].request_bytes
    target = base + bytes_.hidden_bytes_per_token * (setup.max_model_len or 0) if base else 0
    spare = plans["shim"].ok and keeps_spare_state_blocks(specs)
    hidden = plain_config.model_config.get_hidden_size() if plain_config is not None else 0
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
        "prefill_only": prefill_only_plan(setup, memory, target) if spare else None,
        "warnings": warnings_for(setup, plans, hidden),
    }


def keeps_spare_state_blocks(specs: dict[str, Any] | None) -> bool:
    """A state layer's spec reserves speculative blocks beside its own."""
    return any(getattr(spec, "num_speculative_blocks", 0) for spec in (specs or {}).values())


def prefill_only_plan(setup: planning.Setup, memory: int, target: int) -> dict[str, Any]:
    """The shim plan as `launch` runs it (prefill-only): no spare state block per request."""
    from speculators_hybrid.switches import PREFILL_ONLY

    with patch.dict(os.environ, {PREFILL_ONLY: "1"}):
        plan, _, _ = plan_once("shim", setup, memory)
    return {
        "ok": plan.ok,
        "error": plan.error,
        "request_bytes": plan.request_bytes,
        "ratio_to_target": plan.request_bytes / target if plan.ok and target else None,
        "capacity_tokens": plan.capacity_tokens,
    }


DEMO = "qwen3.6-27b"
DEFAULT_MEMORY_GIB = 72.0  # 0.9 x 80 GiB


def run(
    model: str | None,
    ids: tuple[int, ...] | None,
    tp: int,
    max_model_len: int | None,
    memory_gib: float,
    prefix_caching: bool,
    as_json: bool,
    verbose: bool = False,
    max_num_batched_tokens: int | None = None,
    include_last_layer: bool = True,
) -> int:
    """The report for `model` (None: the built-in demo config); 0 when extraction plans with
    the patches, 1 when it does not, 2 for bad input (one line on stderr)."""
    from speculators_hybrid.launcher import LaunchError
    from speculators_hybrid.launcher.target import load

    with tempfile.TemporaryDirectory(prefix="spec-hybrid-demo-") as demo:
        try:
            if model is None:
                from speculators_hybrid.models import write_config

                path = str(write_config(demo, DEMO))
                target = replace(load(path), model=f"the built-in {DEMO} config")
            else:
                path = config_folder(model)
                target = load(path)
            note = None
            if ids:  # as `launch` and speculators' launcher take --target-layer-ids
                from speculators_hybrid.launcher.builtin import layer_ids

                given = argparse.Namespace(
                    target_layer_ids=ids, include_last_layer=include_last_layer
                )
                listed, note = layer_ids(given, target.num_layers)
                note = note if listed != sorted(ids) else None  # said when n was added
                ids = tuple(listed)
            ids = preflight(target, ids, tp)
            if note:  # once the ids are accepted
                print(f"speculators-hybrid doctor: {note}", file=sys.stderr)
        except LaunchError as exc:
            return refuse("doctor", str(exc))
        from speculators_hybrid.plugin import unknown_disabled

        problem = unknown_disabled()  # as `launch` refuses it
        if problem:
            return refuse("doctor", problem)
        if switches.disabled():  # the plugin's own start-up step is then left out here too
            print(
                f"speculators-hybrid doctor: {switches.DISABLE} is set: a vLLM started with it "
                "runs stock (the `stock` plan); unset it for the plan a server with the plugin "
                "gets",
                file=sys.stderr,
            )
        quiet_vllm(verbose)
        with contextlib.redirect_stdout(sys.stderr), warnings.catch_warnings():
            if not verbose:  # vLLM's and transformers' deprecation notes
                warnings.simplefilter("ignore")
            from speculators_hybrid import cpu

            cpu.prepare()
            from vllm.plugins import load_general_plugins

            load_general_plugins()  # stdout is for the report: vLLM's prints go to stderr
            from speculators_hybrid.launcher.model_type import unknown_model_type

            problem = unknown_model_type(target.config)
            if problem:
                return refuse("doctor", problem)
            out = report(
                path, ids, tp, max_model_len, memory_gib, prefix_caching, max_num_batched_tokens
            )
    out["setup"]["model"] = target.model
    out["verdict"] = verdict(out)
    print(json.dumps(out, indent=2) if as_json else render(out))
    return 0 if out["plans"][-1]["ok"] else 1


def config_folder(model: str) -> str:
    """MODEL as doctor plans it: a config.json file stands for its folder."""
    path = os.path.expanduser(model)
    if os.path.basename(path) == "config.json" and os.path.isfile(path):
        return os.path.dirname(path) or "."
    return model


def untested(vllm: str | None) -> str:
    """What to say of a vLLM release the matrix does not run ('' for one it runs)."""
    if vllm in support.VLLM:
        return ""
    return (
        f"vLLM {vllm} is not a release speculators-hybrid is tested on "
        f"({support.tested_range()}); use one of those. "
    )


def verdict(out: dict[str, Any]) -> str:
    """One line: does extraction plan here, what one max-length request costs, and stock's;
    on a release the matrix does not run, that first (a failure may be ours, not vLLM's)."""
    plain, _, shim = out["plans"]
    note = untested(out["vllm_version"])
    if note and not shim["ok"]:
        return f"{note}Here: {plain['error'] if not plain['ok'] else shim['error']}"
    return note + plan_verdict(out)


def fix_hint(error: str) -> str:
    """What to pass doctor for a plan vLLM refused (its own advice names engine options)."""
    if "KV cache memory" in error:  # one max-length request does not fit --memory
        return " Pass a larger --memory (GiB of KV cache) or a smaller --max-model-len."
    if "max_model_len" in error:
        return " Pass --max-model-len N (at most what the model allows)."
    return ""


def plan_verdict(out: dict[str, Any]) -> str:
    plain, stock, shim = out["plans"]
    vllm, length = out["vllm_version"], out["setup"]["max_model_len"]
    if not plain["ok"]:
        hint = fix_hint(plain["error"])
        return f"vLLM {vllm} cannot plan this model even without extraction (above).{hint}"
    if not shim["ok"]:
        said = f"hidden-state extraction does not start on vLLM {vllm}, even with the patches."
        return said + fix_hint(shim["error"])
    ratio = out["ratio_to_target"]["shim"]
    on_stock = (
        "stock vLLM does not start"
        if not stock["ok"]
        else f"stock vLLM reserves {size(stock['request_bytes'])} for it"
    )
    lean = out.get("prefill_only") or {}
    hint = (
        f"; as `launch` runs it (prefill-only) {size(lean['request_bytes'])} "
        f"({lean['ratio_to_target']:.2f}x)"
        if lean.get("ratio_to_target") and ratio and ratio > TARGET >= lean["ratio_to_target"]
        else ""
    )
    return (
        f"hidden-state extraction works on vLLM {vllm} with speculators-hybrid: one "
        f"{length:,}-token request needs {size(shim['request_bytes'])}"
        + (f" ({ratio:.2f}x the target)" if ratio else "")
        + f"{hint}; {on_stock}."
    )


LEGEND = (
    "legend: each row is `groups` KV-cache groups of `x layers` layers each, of one spec kind; "
    "block: tokens per block (a state layer keeps one block per request, whatever its length); "
    "page bytes: what one block of one layer takes; used bytes: the part holding data, the "
    "rest is padding. target: the plan without extraction plus the hidden states' own bytes."
)


def size(n: int) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / (1 << 20):.1f} MiB"


def _on(flag: bool) -> str:
    return "on" if flag else "off"


def render(out: dict[str, Any]) -> str:
    s, b = out["setup"], out["bytes"]
    lines = [
        f"model {s['model']}  ids {list(s['layer_ids'])}  tp {s['tp']}  max_model_len "
        f"{s['max_model_len'] or 0:,}  prefix caching {_on(s['prefix_caching'])}  "
        f"KV memory {out['memory_gib']:g} GiB  vLLM {out['vllm_version']}",
    ]
    if b["attention_layers"] or b["state_layers"]:
        lines.append(
            f"true bytes: attention {b['attention_bytes_per_token']:,}/token "
            f"({b['attention_layers']} layers); state {b['state_bytes_per_request']:,}/request "
            f"({b['state_layers']} layers); hidden states {b['hidden_bytes_per_token']:,}/token"
        )
    if out["request_target_bytes"]:
        lines.append(
            "target for one max-length request: no-extraction plan + hidden states = "
            f"{size(out['request_target_bytes'])}"
        )
    lines.append(LEGEND)
    for p in out["plans"]:
        lines += ["", f"== {TITLES[p['name']]}"]
        if p["patches"]:
            said = f"patches: {', '.join(p['patches'])}"
            lines.append(
                textwrap.fill(
                    said, 100, initial_indent="   ", subsequent_indent="   ", break_on_hyphens=False
                )
            )
        if p["name"] != "no-extraction" and p["connector"]:  # empty: no config was built
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
        if p["mamba_cache_mode"] == "align":
            lines.append(
                f"   Mamba cache mode align (prefix caching); max_num_batched_tokens "
                f"{p['max_num_batched_tokens']:,}"
            )
        lines.append(
            f"   engine block {p['block_size']}; one max-length request needs "
            f"{size(p['request_bytes'])}"
            + (f" ({ratio:.2f}x target)" if ratio else "")
            + f"; KV capacity {p['capacity_tokens']:,} tokens"
        )
    lines += prefill_only_lines(out)
    lines += [f"warning: {w}" for w in out["warnings"]]
    lines += ["", f"verdict: {out['verdict']}"]
    return "\n".join(lines)


def prefill_only_lines(out: dict[str, Any]) -> list[str]:
    p = out.get("prefill_only")
    if not p or not p["ok"]:
        return []
    ratio = f" ({p['ratio_to_target']:.2f}x target)" if p["ratio_to_target"] else ""
    return [
        "",
        "== the same as `launch` runs it (prefill-only, its default for hybrid targets: every",
        "   request max_tokens=1, as speculators' clients send; `--allow-decode` keeps the plan",
        "   above): the state layers keep no spare speculative block per request",
        f"   one max-length request needs {size(p['request_bytes'])}{ratio}; KV capacity "
        f"{p['capacity_tokens']:,} tokens",
    ]


def option_problem(args: argparse.Namespace) -> str | None:
    """Why a numeric option cannot be planned with (None: every one can), said before vLLM
    loads: vLLM would fail 5-15 s later with a pydantic text that names no option."""
    if args.tp < 1:
        return f"--tp {args.tp}: the tensor parallel size is 1 or more"
    for flag, value in (
        ("--max-model-len", args.max_model_len),
        ("--max-num-batched-tokens", args.max_num_batched_tokens),
    ):
        if value is not None and value < 1:
            return f"{flag} {value}: give a number of tokens, 1 or more (or leave it out)"
    if not (math.isfinite(args.memory) and args.memory > 0):
        return f"--memory {args.memory:g}: give the KV-cache memory in GiB, above 0 (e.g. 40)"
    return None


def _cli(args: argparse.Namespace) -> int:
    problem = option_problem(args)
    if (args.model is None) == (not args.demo):
        problem = "give a model or config directory, or --demo (not both)"
    if problem:
        return refuse("doctor", problem)
    return run(
        args.model,
        tuple(args.ids) if args.ids else None,
        args.tp,
        args.max_model_len,
        args.memory,
        args.prefix_caching,
        args.json,
        args.verbose,
        args.max_num_batched_tokens,
        args.include_last_layer,
    )


def _layer_id(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        hint = " (MODEL goes before --ids)" if os.path.sep in text or os.path.isdir(text) else ""
        raise argparse.ArgumentTypeError(f"{text!r} is not a layer id{hint}") from None


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    """Register `doctor` on the `speculators-hybrid` subcommands."""
    doc = subparsers.add_parser(
        "doctor",
        help="vLLM's KV-cache plan for extraction, with and without us (CPU, config.json only)",
        description=(__doc__ or "").split("`--json`")[0].strip(),
        epilog="Exit status: 0 extraction plans with the patches, 1 it does not, 2 bad input.",
    )
    doc.add_argument(
        "model", nargs="?", help="model or config directory, or its config.json (it is enough)"
    )
    doc.add_argument(
        "--demo",
        action="store_true",
        help=f"use the built-in {DEMO} hybrid config (no network, no weights)",
    )
    doc.add_argument(
        "--ids",
        type=_layer_id,
        nargs="+",
        metavar="ID",
        help="target layer ids (default: speculators' [2, n//2, n-3, n]); n, the last layer, "
        "is added as `launch` adds it",
    )
    doc.add_argument(
        "--include-last-layer",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="add n, the last layer, to --ids, as `launch` and speculators' launcher do "
        "(default on; --no-include-last-layer plans the ids as given)",
    )
    doc.add_argument(
        "--tp", type=int, default=1, metavar="N", help="tensor parallel size (default 1)"
    )
    doc.add_argument(
        "--max-model-len",
        type=int,
        metavar="N",
        help="tokens per request (default: what vLLM derives from the model's config)",
    )
    doc.add_argument(
        "--memory",
        type=float,
        default=DEFAULT_MEMORY_GIB,
        metavar="GIB",
        help="KV-cache memory the capacity is computed for, in GiB (default "
        f"{DEFAULT_MEMORY_GIB:g}: an 80 GiB H100 at vLLM's default gpu_memory_utilization 0.9, "
        "before the weights take their share; give what your server leaves the KV cache)",
    )
    doc.add_argument(
        "--prefix-caching", action="store_true", help="plan with prefix caching on (default off)"
    )
    doc.add_argument(
        "--max-num-batched-tokens",
        type=int,
        metavar="N",
        help="vLLM's max_num_batched_tokens (default: vLLM's); with prefix caching, vLLM "
        "0.20-0.26 refuse an engine block above it (Mamba align mode)",
    )
    doc.add_argument(
        "--json", action="store_true", help="the report as JSON on stdout (docs/doctor.md)"
    )
    doc.add_argument(
        "-v", "--verbose", action="store_true", help="show vLLM's own logs (on stderr)"
    )
    doc.set_defaults(func=_cli)
