"""A built-in launcher with the CLI and command of speculators' main-branch `launch_vllm.py`
(MODEL first, unknown args to vLLM, the first `--` dropped), reading config.json directly."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from speculators_hybrid import extraction
from speculators_hybrid.launcher import target
from speculators_hybrid.launcher.command import Command


class FileBackend:
    """The `file` backend: one safetensors file per request under --hidden-states-path."""

    @staticmethod
    def add_launch_args(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--hidden-states-path",
            default=extraction.STORAGE,
            help="directory the connector writes hidden states to (default /tmp/hidden_states)",
        )

    @staticmethod
    def build_kv_transfer_config(args: argparse.Namespace) -> dict[str, Any]:
        return extraction.kv_transfer_config(args.hidden_states_path)


def backends() -> dict[str, Any]:
    """`hs_connectors`' registry when it is installed (as main does), `file` always."""
    try:
        from hs_connectors import HiddenStatesBackend

        registry: dict[str, Any] = dict(HiddenStatesBackend.registry)
    except ImportError:
        registry = {}
    registry.setdefault("file", FileBackend)
    return registry


def parser(registry: dict[str, Any]) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="speculators-hybrid launch",
        description="Launch vLLM for hidden-state extraction (speculators' launch_vllm.py CLI), "
        "adjusted for hybrid targets. Unknown arguments, and all after `--`, go to vLLM.",
        usage="%(prog)s [--launcher PATH] MODEL [options] [-- VLLM_ARGS...]",
    )
    p.add_argument("model", help="local model directory (or a hub id in the local HF cache)")
    p.add_argument(
        "--launcher",
        metavar="PATH",
        help="run this speculators scripts/launch_vllm.py (any release) instead of the built-in "
        "one; write it in full, before MODEL or `--`",
    )
    p.add_argument(
        "--hidden-states-backend",
        choices=list(registry),
        default="file",
        help="how hidden states reach the trainer (default file; README says which to use)",
    )
    for backend in registry.values():
        backend.add_launch_args(p)
    p.add_argument("--target-layer-ids", type=int, nargs="+", help="default [2, n//2, n-3, n]")
    p.add_argument(
        "--include-last-layer",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="append n (the last layer) to --target-layer-ids when missing (default on)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the command, do not run it: "
        "`env NAME=VALUE... COMMAND` where its environment differs from this one, a line to "
        "paste into a job script",
    )
    p.add_argument(
        "--allow-decode",
        action="store_true",
        help="serve requests that decode (max_tokens > 1) too; a hybrid target's state layers "
        "then keep a spare block per request (less KV capacity). Without it a hybrid target's "
        "server extracts prompts only, as speculators' clients ask (any launcher)",
    )
    p.add_argument(
        "--prefill-only",
        action="store_true",
        help="refuse requests that decode, on any target (the default for hybrid targets)",
    )
    p.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="accepted for compatibility (config.json is read as JSON); pass it after `--` "
        "for vLLM itself",
    )
    return p


def layer_ids(args: argparse.Namespace, n: int) -> tuple[list[int], str | None]:
    """speculators' default, or the given ids sorted with n appended unless turned off; and
    the note to print once the command is accepted (main's launcher warns instead)."""
    if not args.target_layer_ids:
        return extraction.speculators_default(n), None
    ids = list(args.target_layer_ids)
    added = args.include_last_layer and n not in ids
    ids = sorted([*ids, n] if added else ids)
    note = (
        f"target layer ids {ids}"
        + (f" ({n}, the last layer, added: --no-include-last-layer leaves it out)" if added else "")
        + ": give the training script the same ids"
    )
    return ids, note


def build(argv: list[str]) -> tuple[Command, argparse.Namespace]:
    """The command main's launcher would exec for `argv`, and the parsed arguments (with
    `ids_note`, what to say about custom ids)."""
    registry = backends()
    args, vllm_args = parser(registry).parse_known_args(argv)
    if "--" in vllm_args:
        vllm_args.remove("--")
    n = target.load(args.model).num_layers
    ids, args.ids_note = layer_ids(args, n)
    speculative = extraction.speculative_config(ids)
    kv_transfer = registry[args.hidden_states_backend].build_kv_transfer_config(args)
    argv_out = [
        sys.executable,
        "-m",
        "vllm.entrypoints.cli.main",
        "serve",
        args.model,
        "--speculative_config",
        json.dumps(speculative),
        "--kv_transfer_config",
        json.dumps(kv_transfer),
        *vllm_args,
    ]
    return Command(argv_out[0], argv_out), args
