"""Test doubles of speculators' `scripts/launch_vllm.py`, one behaviour per release line.

Written from the documented contract (not copied): argparse CLI with MODEL first and unknown
args for vLLM (`parse_known_args`, first `--` dropped), n = num_hidden_layers (of text_config
when present), ids [2, n//2, n-3, n] or the given ones (+ n unless --no-include-last-layer),
print `Running command:` and the space-joined command, then `os.execvp` it unless --dry-run.
The real scripts read n through transformers' AutoConfig; the doubles read config.json.

Per release:
  0.5.0  --hidden-states-path only; no forced flags.
  0.6.x  as 0.5.0, and always appends --no-enable-chunked-prefill (unless already present).
  0.7.x  --hidden-states-backend from speculators' vendored hs_connectors registry (inline
         `file` fallback); still forces --no-enable-chunked-prefill.
  main   registry from the `hs_connectors` package; no forced flag; --trust-remote-code.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import warnings
from pathlib import Path

RELEASES = {
    "0.5.0": {"registry": None, "force_no_chunked": False, "trust": False},
    "0.6.x": {"registry": None, "force_no_chunked": True, "trust": False},
    "0.7.x": {
        "registry": "speculators._vendor.hs_connectors",
        "force_no_chunked": True,
        "trust": False,
    },
    "main": {"registry": "hs_connectors", "force_no_chunked": False, "trust": True},
}


class InlineFile:
    @staticmethod
    def add_launch_args(parser):
        parser.add_argument("--hidden-states-path", type=str, default="/tmp/hidden_states")

    @staticmethod
    def build_kv_transfer_config(args):
        extra = {"shared_storage_path": args.hidden_states_path}
        return {
            "kv_connector": "ExampleHiddenStatesConnector",
            "kv_role": "kv_producer",
            "kv_connector_extra_config": extra,
        }


def registry(module):
    try:
        found = dict(importlib.import_module(module).HiddenStatesBackend.registry)
    except ImportError:
        found = {}
    found.setdefault("file", InlineFile)
    return found


def num_layers(model):
    config = json.loads((Path(model) / "config.json").read_text())
    return config.get("text_config", config)["num_hidden_layers"]


def main(release):
    spec = RELEASES[release]
    parser = argparse.ArgumentParser(description="Launch vLLM for hidden states extraction")
    parser.add_argument("model", type=str)
    backends = registry(spec["registry"]) if spec["registry"] else None
    if backends is None:
        InlineFile.add_launch_args(parser)
    else:
        parser.add_argument("--hidden-states-backend", choices=list(backends), default="file")
        for backend in backends.values():
            backend.add_launch_args(parser)
    parser.add_argument("--target-layer-ids", type=int, nargs="+")
    parser.add_argument("--include-last-layer", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--dry-run", action="store_true")
    if spec["trust"]:
        parser.add_argument("--trust-remote-code", action="store_true")
    args, vllm_args = parser.parse_known_args()
    if "--" in vllm_args:
        vllm_args.remove("--")

    n = num_layers(args.model)
    if args.target_layer_ids:
        ids = args.target_layer_ids
        if args.include_last_layer and n not in ids:
            ids.append(n)
        warnings.warn(f"Using custom target layer ids {ids}.", stacklevel=2)
    else:
        ids = [2, n // 2, n - 3, n]

    hf_config = {"eagle_aux_hidden_state_layer_ids": ids}
    speculative = {
        "method": "extract_hidden_states",
        "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": hf_config},
    }
    backend = InlineFile if backends is None else backends[args.hidden_states_backend]
    cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", args.model]
    cmd += ["--speculative_config", json.dumps(speculative)]
    cmd += ["--kv_transfer_config", json.dumps(backend.build_kv_transfer_config(args))]
    cmd += vllm_args
    if spec["force_no_chunked"] and "--no-enable-chunked-prefill" not in cmd:
        cmd.append("--no-enable-chunked-prefill")

    print("Running command:")
    print(" ".join(cmd))
    if not args.dry_run:
        os.execvp(cmd[0], cmd)
