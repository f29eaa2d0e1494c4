"""Adjust a launcher's command for a hybrid target; any other target's command is untouched."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from importlib import metadata
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from speculators_hybrid import backends, families, support, switches
from speculators_hybrid.extraction import id_problems as id_problems
from speculators_hybrid.extraction import layer_ids_error
from speculators_hybrid.launcher import LaunchError
from speculators_hybrid.launcher.command import Command
from speculators_hybrid.launcher.target import Target, tp_error
from speculators_hybrid.vllm_patches import mamba_all_mode as all_mode
from speculators_hybrid.vllm_patches.chunked_prompts import PATCH as CHUNKED_PROMPTS
from speculators_hybrid.vllm_patches.hidden_read import PATCH as READ_SLOTS
from speculators_hybrid.vllm_patches.prefix_caching import PATCH as NO_PREFIX_CACHING
from speculators_hybrid.vllm_patches.prefix_caching import (
    stock_refuses_chunked,
)

PLUGIN = "speculators_hybrid"
NO_CHUNKED_PREFILL = "--no-enable-chunked-prefill"
BACKEND_FLAG = "--hidden-states-backend"  # speculators' launcher has it from 0.7.0
LANGUAGE_ONLY = "--language-model-only"
FIRST_LANGUAGE_ONLY = Version("0.20.1")  # MultiModalConfig.language_model_only
OWN_CONNECTOR_BEFORE = Version("0.22")  # below it our connector writes the files (writer.py)
# stock vLLM 0.25.x stops at start-up for hybrid extraction with prefix caching on (the engine
# block size is the hidden group's, not a multiple of the hash block size)
STOCK_PREFIX_CACHING_CRASH = SpecifierSet(">=0.25,<0.26")
FIRST_WAITING_READER = Version("0.6")  # speculators' readers wait on `<path>.lock` from 0.6.0
TP_FLAGS = ("--tensor-parallel-size", "--tensor_parallel_size", "-tp")
BATCH_FLAGS = ("--max-num-batched-tokens", "--max_num_batched_tokens")
MAMBA_MODE_FLAGS = ("--mamba-cache-mode", "--mamba_cache_mode")
LEN_FLAGS = ("--max-model-len", "--max_model_len")
KV_FLAGS = ("--kv_transfer_config", "--kv-transfer-config")

Log = Callable[[str], None]


def check_layer_ids(ids: Sequence[Any], target: Target, flag: str | None = None) -> None:
    """The same check and message as the vLLM-side patch (vllm_patches/extraction_input.py);
    `flag`: the option the message names (default: the launcher's)."""
    in_text = "text_config" in target.config
    message = layer_ids_error(ids, target.num_layers, target.model, in_text, flag)
    if message is not None:
        raise LaunchError(message)


def check_family(target: Target, vllm: str | None) -> None:
    """Refuse a model family that has no EAGLE-3 hidden states on this vLLM (families.py)."""
    message = families.refusal(target.model_type, vllm)
    if message is not None:
        raise LaunchError(message)


def check_backend(cmd: Command, vllm: str | None) -> None:
    """Refuse a hidden-state backend that cannot work on this vLLM (backends.py)."""
    backend = backends.of_command(cmd.option(KV_FLAGS))
    message = None if backend is None else backends.refusal(backend, vllm)
    if message is not None:
        raise LaunchError(message)


def check_tp(cmd: Command, target: Target) -> None:
    """Refuse a tensor parallel size that does not divide the model's heads (target.tp_error)."""
    raw = cmd.option(TP_FLAGS)
    if raw is not None and raw.strip().lstrip("+-").isdigit():
        message = tp_error(target, int(raw))
        if message is not None:
            raise LaunchError(message)


def _plugins_env(env: dict[str, str], log: Log) -> dict[str, str] | None:
    """VLLM_PLUGINS is an allow-list of exact names: make sure ours is on it."""
    value = env.get("VLLM_PLUGINS")
    if value is None or PLUGIN in value.split(","):
        return None
    new = f"{value},{PLUGIN}" if value else PLUGIN
    log(f"VLLM_PLUGINS={value!r} leaves out our plugin; running with VLLM_PLUGINS={new!r}")
    return {**env, "VLLM_PLUGINS": new}


def launcher_generation(cmd: Command, user_args: list[str]) -> str | None:
    """The speculators release line of a --launcher script, told by its CLI: "0.5" (no
    --hidden-states-backend and no forced --no-enable-chunked-prefill: speculators 0.5.0),
    "0.6" (forces that flag), "0.7+" (has the backend option); None for the built-in launcher,
    or where 0.5 and 0.6 look alike (the user passed --no-enable-chunked-prefill)."""
    if cmd.launcher_options is None:
        return None
    if BACKEND_FLAG in cmd.launcher_options:
        return "0.7+"
    if NO_CHUNKED_PREFILL in user_args:
        return None
    return "0.6" if NO_CHUNKED_PREFILL in cmd.argv else "0.5"


def _writes_env(
    env: dict[str, str], vllm: str | None, ours: bool, log: Log, generation: str | None = None
) -> dict[str, str] | None:
    """Files off the engine step unless a reader would not wait for them (README): speculators
    < 0.6 installed here, or the launcher is 0.5.0's, wherever its speculators is installed.
    `ours`: our connector writes them (vLLM < 0.22; 0.22-0.23 with chunked prefill)."""
    v = _version(vllm)
    if v is None or switches.ASYNC_WRITES in env:
        return None
    try:
        reader = _version(metadata.version("speculators"))
    except metadata.PackageNotFoundError:
        reader = None
    whose = f"speculators {reader}"
    if generation == "0.5" and (reader is None or reader >= FIRST_WAITING_READER):
        reader, whose = Version("0.5.0"), "speculators 0.5.0 (this launcher's release)"
    waits = reader is None or reader >= FIRST_WAITING_READER
    if v >= OWN_CONNECTOR_BEFORE and not ours:
        if not waits:
            log(
                f"warning: {whose} reads hidden-state files without waiting for "
                f"their lock, and vLLM {vllm} writes them after the response: upgrade "
                "speculators to >= 0.6"
            )
        return None
    if not waits:
        log(
            f"{whose} reads hidden-state files without waiting for their lock: "
            f"files written inside the engine step ({switches.ASYNC_WRITES}=0, "
            "slower than off the step: "
            "benchmarks/results/README.md); speculators >= 0.6 waits"
        )
        return {**env, switches.ASYNC_WRITES: "0"}
    log(
        "hidden-state files are written off the engine step: a reader waits on <path>.lock "
        f"(speculators >= 0.6 does; for one that does not, set {switches.ASYNC_WRITES}=0)"
    )
    return None


def stops_engine(target: Target, vllm: str | None, argv: list[str]) -> bool:
    """Prefix caching would stop the engine core for this model (mamba_all_mode.py): vLLM
    would cache its Mamba state in 'all' mode, asked for or its default (before 0.28)."""
    mode = Command("", argv).option(MAMBA_MODE_FLAGS)
    return all_mode.caches_all(mode, vllm) and all_mode.stops_engine(target.model_type, vllm)


def chunks_refused(user_args: list[str], vllm: str | None) -> bool:
    """The plugin turns prefix caching off (vllm_patches/prefix_caching.py): on 0.22-0.23 the
    user's --no-enable-chunked-prefill keeps vLLM's connector, which refuses chunked prefill."""
    return bool(NO_PREFIX_CACHING.needed_for(vllm)) and NO_CHUNKED_PREFILL in user_args


def _plugin_checks(log: Log) -> bool:
    """Warn where vLLM will not run our plugin; whether it will."""
    names = {ep.name for ep in metadata.entry_points(group="vllm.general_plugins")}
    if PLUGIN not in names:
        log(
            f"warning: {PLUGIN} is not installed as a vLLM plugin in this environment "
            "(pip install it next to vLLM), so vLLM will not load it"
        )
    if switches.on(switches.DISABLE):
        log(f"warning: {switches.DISABLE} is set: the plugin will patch nothing")
        return False
    return PLUGIN in names


def _version(text: str | None) -> Version | None:
    try:
        return Version(text) if text else None
    except InvalidVersion:
        return None


def vllm_notes(
    version: str | None, argv: list[str], target: Target, plugin: bool, refused: bool = False
) -> list[str]:
    """Known problems of the installed vLLM with hybrid extraction, and what the plugin (if it
    will run) does about them; notes only, the command is not changed here."""
    notes: list[str] = []
    v = _version(version)
    if v is None:
        return notes + ["warning: vLLM not found for this Python (or its version unreadable)"]
    oldest = min(support.VLLM, key=Version)
    if v < Version(oldest):
        notes.append(
            f"warning: vLLM {version} is older than {oldest}, the oldest release "
            "speculators-hybrid is tested with"
        )
    if READ_SLOTS.needed_for(version):  # the releases whose hidden-state reads are wrong
        if plugin:
            notes.append(f"vLLM {version}: the plugin's {READ_SLOTS.id} keeps hidden states right")
        else:
            notes.append(
                f"warning: vLLM {version}: hybrid targets can get all-zero hidden states with no "
                "error (speculators issue 613, fixed in 0.25.0); upgrade"
            )
    if "--enable-prefix-caching" not in argv:
        return notes
    if plugin and stops_engine(target, version, argv):
        notes.append(
            f"vLLM {version}: the plugin turns prefix caching off for this model: vLLM would "
            "cache its Mamba state per block ('all' mode), where extraction stops the engine "
            f"core on a 1-token prefill chunk ({all_mode.PATCH.id}; --mamba-cache-mode align "
            "keeps it on, not GPU-proven)"
        )
    elif plugin and refused:
        notes.append(
            f"vLLM {version}: the plugin turns prefix caching off for hybrid extraction: with "
            f"{NO_CHUNKED_PREFILL}, vLLM's connector writes the files, and a hybrid model's "
            f"caching needs chunked prefill ({NO_PREFIX_CACHING.id}; drop the flag to keep it)"
        )
    elif plugin and v >= OWN_CONNECTOR_BEFORE:
        notes.append(
            f"--enable-prefix-caching: vLLM {version}: the plugin keeps it on (files after "
            "prefix-cache hits matched transformers on a GPU on 0.20.1, 0.24.0 and 0.25.0; "
            "`speculators-hybrid verify` checks yours)"
        )
    elif stock_refuses_chunked(version):
        notes.append(
            f"warning: vLLM {version} cannot extract from a hybrid target with prefix caching: "
            "mamba 'align' mode needs chunked prefill, the connector refuses it"
        )
    elif Version(v.base_version) in STOCK_PREFIX_CACHING_CRASH:
        notes.append(
            f"warning: vLLM {version} is expected to fail at start-up for hybrid extraction "
            "with --enable-prefix-caching (block_size vs hash_block_size)"
        )
    return notes


def chunked_prefill(
    argv: list[str], user_args: list[str], vllm: str | None, plugin: bool, log: Log
) -> list[str]:
    """Drop the launcher-forced --no-enable-chunked-prefill, except on vLLM 0.22-0.23 without
    the plugin: their stock connector refuses chunked prefill (there it is added if missing).
    With the plugin, our connector takes chunked prompts there (hidden-states-chunked-prompts)."""
    if stock_refuses_chunked(vllm) and not (plugin and CHUNKED_PROMPTS.needed_for(vllm)):
        if NO_CHUNKED_PREFILL not in argv and "--enable-chunked-prefill" not in user_args:
            argv.append(NO_CHUNKED_PREFILL)
            log(
                f"added {NO_CHUNKED_PREFILL}: vLLM {vllm}'s ExampleHiddenStatesConnector "
                "refuses chunked prefill"
            )
        return argv
    if NO_CHUNKED_PREFILL in argv and NO_CHUNKED_PREFILL not in user_args:
        argv = [a for a in argv if a != NO_CHUNKED_PREFILL]
        why = (
            "with prefix caching on a hybrid target vLLM uses the mamba 'align' cache mode, "
            "which needs chunked prefill"
            if "--enable-prefix-caching" in argv
            else f"{f'vLLM {vllm}' if vllm else 'vLLM'} extracts with chunked prefill on (only "
            "0.22-0.23's own connector refuses it), so a prompt longer than "
            "max_num_batched_tokens is served in chunks "
            f"(pass {NO_CHUNKED_PREFILL} after `--` to keep it)"
        )
        log(f"removed {NO_CHUNKED_PREFILL} (forced by this launcher): {why}")
    return argv


def _align_check(argv: list[str], target: Target, batched: int) -> dict[str, Any]:
    """`python -m speculators_hybrid.align_mode` in this Python (vLLM's planning on the CPU
    in a child process: nothing of it reaches the server this process becomes)."""
    import subprocess
    import sys

    probe = Command("", argv)
    child = [sys.executable, "-m", "speculators_hybrid.align_mode", str(target.config_path.parent)]
    child += ["--ids", *map(str, probe.layer_ids()), "--max-num-batched-tokens", str(batched)]
    tp, length = probe.option(TP_FLAGS), probe.option(LEN_FLAGS)
    child += ["--tp", tp] if tp and tp.strip().isdigit() else []
    child += ["--max-model-len", length] if length and length.strip().isdigit() else []
    child += ["--language-model-only"] if LANGUAGE_ONLY in argv else []
    done = subprocess.run(child, capture_output=True, text=True, check=False)
    lines = done.stdout.strip().splitlines()
    try:
        return dict(json.loads(lines[-1]))
    except (IndexError, ValueError):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"planning_error": f"exit status {done.returncode}: {tail}"}


def align_mode_batch(
    argv: list[str],
    user_args: list[str],
    vllm: str | None,
    target: Target,
    plugin: bool,
    log: Log,
    checker: Callable[[list[str], Target, int], dict[str, Any]] = _align_check,
) -> list[str]:
    """Mamba align mode's start-up constraint (speculators_hybrid/align_mode.py) before vLLM
    starts: where this vLLM asserts block_size <= max_num_batched_tokens, prefix caching stays
    on for extraction and the command sets max_num_batched_tokens, that value is checked with
    vLLM's own planning. Below the engine block: raised to it (logged) when the launcher set
    it, a LaunchError when the user did (their value is theirs to change). Unset, vLLM's GPU
    defaults apply (2048 or 8192, above the engine blocks planned so far); `doctor
    --prefix-caching` shows the engine block."""
    from speculators_hybrid import align_mode

    raw = Command("", argv).option(BATCH_FLAGS)
    if not (plugin and align_mode.constrained(vllm)) or raw is None or not raw.strip().isdigit():
        return argv
    off_by_patch = chunks_refused(user_args, vllm) or stops_engine(target, vllm, argv)
    if "--no-enable-prefix-caching" in argv or off_by_patch:
        return argv  # caching off (asked for, or by our patch): no align mode
    result = checker(argv, target, int(raw))
    if "planning_error" in result:
        log(f"warning: could not check the Mamba align-mode block size: {result['planning_error']}")
        return argv
    check = align_mode.as_check(result)
    if check.ok:
        return argv
    if Command("", user_args).option(BATCH_FLAGS) is not None or not check.smallest_valid:
        raise LaunchError(check.message())
    value = str(check.smallest_valid)
    out: list[str] = []
    for i, arg in enumerate(argv):
        name = arg.split("=", 1)[0]
        if name in BATCH_FLAGS and "=" in arg:
            arg = f"{name}={value}"
        elif i and argv[i - 1] in BATCH_FLAGS:
            arg = value
        out.append(arg)
    log(
        f"raised --max-num-batched-tokens {raw} (set by the launcher) to {value}: with prefix "
        f"caching on, vLLM {vllm} caches the state in 'align' mode and refuses an engine block "
        f"({check.block_size} tokens) above it"
    )
    return out


def for_hybrid(
    cmd: Command, target: Target, user_args: list[str], vllm: str | None, log: Log
) -> Command:
    """The command with what a hybrid target needs; `user_args` are what the user passed."""
    if not target.hybrid:
        return cmd
    check_layer_ids(cmd.layer_ids(), target)
    check_family(target, vllm)
    check_backend(cmd, vllm)
    check_tp(cmd, target)
    plugin = _plugin_checks(log)
    generation = launcher_generation(cmd, user_args)  # before the forced flag is dropped
    argv = chunked_prefill(list(cmd.argv), user_args, vllm, plugin, log)
    if target.multimodal and not any(
        "language-model-only" in a or "language_model_only" in a for a in argv
    ):
        if (v := _version(vllm)) is not None and v < FIRST_LANGUAGE_ONLY:
            log(f"not adding {LANGUAGE_ONLY}: vLLM {vllm} lacks it")
        else:
            argv.append(LANGUAGE_ONLY)
            log(
                f"multimodal checkpoint: added {LANGUAGE_ONLY}, the vision tower is not built; "
                f"layer ids come from text_config (n = {target.num_layers})"
            )
    for note in vllm_notes(vllm, argv, target, plugin, chunks_refused(user_args, vllm)):
        log(note)
    argv = align_mode_batch(argv, user_args, vllm, target, plugin, log)
    env = dict(cmd.env if cmd.env is not None else os.environ)
    changed = _plugins_env(env, log)
    ours = plugin and CHUNKED_PROMPTS.needed_for(vllm) and NO_CHUNKED_PREFILL not in argv
    changed = _writes_env(changed or env, vllm, ours, log, generation) or changed
    return replace(cmd, argv=argv, env=changed if changed is not None else cmd.env)


def for_target(
    cmd: Command, target: Target, user_args: list[str], vllm: str | None, log: Log
) -> Command:
    if target.hybrid:
        return for_hybrid(cmd, target, user_args, vllm, log)
    try:
        ids, _ = cmd.layer_ids(), target.num_layers
    except LaunchError:
        return cmd  # nothing we can read: the stock command, as it is
    check_layer_ids(ids, target)  # vLLM with our plugin refuses bad ids on any target
    return cmd
