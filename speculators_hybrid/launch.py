"""`speculators-hybrid launch [--launcher PATH] [--allow-decode] MODEL [options] [-- vLLM args]`.

Runs speculators' `scripts/launch_vllm.py` (with `--launcher`, any release, unchanged) or a
built-in launcher with the main-branch CLI, takes the `vllm serve` command it would exec,
adjusts it for hybrid targets (plugin allow-listed, forced `--no-enable-chunked-prefill` dropped,
layer ids checked, `--language-model-only` for multimodal checkpoints), prints it and execs it
in this process (same PID). Other targets get exactly the launcher's command.

A hybrid target's server extracts prompts only by default (`prefill-only-extraction`: every
speculators client sends `max_tokens=1`, so the state layers keep no spare block per request);
`--allow-decode` serves requests that decode, at that block's cost in KV capacity.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Mapping

from speculators_hybrid import switches
from speculators_hybrid.launcher import LaunchError, adjust, builtin, intercept, target
from speculators_hybrid.launcher.command import Command
from speculators_hybrid.launcher.model_type import refuse_unknown
from speculators_hybrid.plugin import unknown_disabled
from speculators_hybrid.usage import refuse
from speculators_hybrid.versions import installed
from speculators_hybrid.vllm_patches.writer import writer_threads

DRY_RUN = "--dry-run"
DRY_RUN_BANNER = "Would run (--dry-run, nothing started):"
PREFILL_ONLY = "--prefill-only"  # the default for hybrid targets; still accepted
ALLOW_DECODE = "--allow-decode"
MODE_FLAGS = (PREFILL_ONLY, ALLOW_DECODE)


def log(message: str) -> None:
    print(f"speculators-hybrid: {message}", file=sys.stderr, flush=True)


def split_args(argv: list[str]) -> tuple[str | None, bool, list[str]]:
    """(--launcher PATH, --dry-run, the rest); only what comes before the first `--` is ours.

    --dry-run is taken here (also abbreviated, as argparse would) so a launcher always reaches
    its exec, which we catch. The serving-mode flags are taken before, by `mode_flags`."""
    launcher, dry_run, rest = None, False, []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            rest.extend(argv[i:])
            break
        if arg == "--launcher":
            if i + 1 >= len(argv):
                raise LaunchError("--launcher needs a PATH")
            launcher, i = argv[i + 1], i + 2
            continue
        if arg.startswith("--launcher="):
            launcher = arg.split("=", 1)[1]
        elif len(arg) > 2 and DRY_RUN.startswith(arg):
            dry_run = True
        else:
            rest.append(arg)
        i += 1
    return launcher, dry_run, rest


def mode_flags(argv: list[str]) -> tuple[set[str], list[str]]:
    """(--prefill-only / --allow-decode given before `--`, ARGV without them)."""
    cut = argv.index("--") if "--" in argv else len(argv)
    given = {a for a in argv[:cut] if a in MODE_FLAGS}
    return given, [a for a in argv[:cut] if a not in MODE_FLAGS] + argv[cut:]


def serving_mode(given: set[str], hybrid: bool) -> tuple[str | None, str]:
    """(the value of SPECULATORS_HYBRID_PREFILL_ONLY for vLLM, None to leave the environment as
    it is; what to log)."""
    if given == set(MODE_FLAGS):
        raise LaunchError(f"{PREFILL_ONLY} and {ALLOW_DECODE} contradict each other: give one")
    decode = "requests that decode are served; each state layer keeps a spare block per request"
    if ALLOW_DECODE in given:
        return "0", f"{decode} ({ALLOW_DECODE}: less KV capacity)"
    lean = "no spare state block per request (more KV capacity); requests must have max_tokens=1"
    if PREFILL_ONLY in given:
        return "1", f"prefill-only extraction ({PREFILL_ONLY}): {lean}"
    if not hybrid:
        return None, ""
    if switches.PREFILL_ONLY in os.environ:
        return (
            None,
            f"{switches.PREFILL_ONLY}={os.environ[switches.PREFILL_ONLY]!r} "
            "kept from the environment",
        )
    return "1", (
        f"prefill-only extraction, the default for hybrid targets (speculators' clients send "
        f"max_tokens=1): {lean}; {ALLOW_DECODE} serves others"
    )


def plan(argv: list[str]) -> tuple[Command, bool]:
    """The final command for `launch ARGV`, and whether this is a dry run."""
    given, argv = mode_flags(argv)
    launcher, dry_run, rest = split_args(argv)
    problem = unknown_disabled()  # else only a line in vLLM's log would say it
    if problem:
        raise LaunchError(problem)
    # else the engine core would stop on it, with a traceback
    if switches.WRITER_THREADS in os.environ:
        try:
            writer_threads(lambda key, default: default)
        except ValueError as exc:
            raise LaunchError(str(exc)) from None
    notes: list[str] = []  # about the ids, said once the command is accepted
    if launcher is not None:
        if rest and not rest[0].startswith("-"):  # MODEL, first as the launchers take it: a
            target.config_path(rest[0])  # missing path or uncached hub id, before the hub tries
            _known(target.load(rest[0]))  # before the launcher's transformers says it its way
        cmd = intercept.capture(launcher, rest, notes.append)
    else:
        cmd, args = builtin.build(rest)
        if args.launcher is not None:
            raise LaunchError("write --launcher PATH in full, before MODEL")
        dry_run = dry_run or args.dry_run
        notes += [args.ids_note] if args.ids_note else []
    tgt = target.load(cmd.model())
    _known(tgt)
    cmd = adjust.for_target(cmd, tgt, rest, installed("vllm"), log)
    for note in notes:
        log(note)
    value, why = serving_mode(given, tgt.hybrid)
    if value is not None:
        cmd.env = {**(os.environ if cmd.env is None else cmd.env), switches.PREFILL_ONLY: value}
    if why:
        log(why)
    return cmd, dry_run


def _known(tgt: target.Target) -> None:
    problem = refuse_unknown(tgt.config)
    if problem:
        raise LaunchError(problem)


def shell_line(cmd: Command, base: Mapping[str, str] | None = None) -> str:
    """`cmd` as one shell line that runs the same thing from the environment `base` (this
    process's by default): `env [-u NAME]... NAME=VALUE... FILE ARGS...` where the command's
    environment differs from it, else `FILE ARGS...`; every word shell-quoted."""
    base = os.environ if base is None else base
    words = [cmd.file, *cmd.argv[1:]]
    if cmd.env is None:
        return shlex.join(words)
    unset = [w for name in sorted(set(base) - set(cmd.env)) for w in ("-u", name)]
    changed = [f"{k}={v}" for k, v in sorted(cmd.env.items()) if base.get(k) != v]
    return shlex.join(["env", *unset, *changed, *words] if unset or changed else words)


def execute(cmd: Command) -> None:
    """Replace this process with `cmd` (returns only if the exec fails)."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        if cmd.env is None:
            (os.execvp if cmd.search_path else os.execv)(cmd.file, cmd.argv)
        else:
            (os.execvpe if cmd.search_path else os.execve)(cmd.file, cmd.argv, cmd.env)
    except OSError as exc:
        raise LaunchError(f"cannot exec {cmd.file}: {exc.strerror or exc}") from exc


def main(argv: list[str] | None = None) -> int:
    try:
        cmd, dry_run = plan(list(sys.argv[1:] if argv is None else argv))
        print(DRY_RUN_BANNER if dry_run else intercept.BANNER)
        print(shell_line(cmd), flush=True)
        if dry_run:
            return 0
        execute(cmd)
    except intercept.LauncherExit as exc:
        return exc.code
    except SystemExit as exc:  # the built-in parser's --help or usage error
        return exc.code if isinstance(exc.code, int) else 2
    except LaunchError as exc:
        return refuse("launch", str(exc))
    return 2


def _run(args: argparse.Namespace) -> int:
    return main(args.argv)


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    """Register `launch` on the `speculators-hybrid` subcommands (arguments parsed by `main`)."""
    # NUL never starts a real argument: every token, `-h` and `--` included, reaches `main`.
    p = subparsers.add_parser(
        "launch",
        help="run speculators' launch_vllm.py (or a built-in one), adjusted for hybrid targets",
        add_help=False,
        prefix_chars="\0",
    )
    p.add_argument(
        "argv",
        nargs=argparse.REMAINDER,
        help="[--launcher PATH] MODEL [launcher options] [-- vLLM args] (`launch --help`)",
    )
    p.set_defaults(func=_run)


if __name__ == "__main__":
    sys.exit(main())
