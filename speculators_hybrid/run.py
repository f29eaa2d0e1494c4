"""`speculators-hybrid run -- CMD...`: run a speculators command with our speculators patches.

Mechanism: `CMD` replaces this process (`exec`, so signals, exit status and the PID behave as
if `CMD` ran directly) with `speculators_hybrid/bootstrap` first on `PYTHONPATH`. Every
Python process started from there on (the command itself, torchrun workers, DataLoader and
`multiprocessing` workers, `subprocess` children) imports that directory's `sitecustomize`,
which adds a stdlib-only import finder and then runs any `sitecustomize` it shadows. When
the process first imports speculators, the finder applies the patches of
`speculators_hybrid.speculators_patches` through the patch framework (version-gated,
fingerprint-checked, fail closed) and logs one line for that process. Processes that never
import speculators load nothing of ours; nothing is patched in vLLM. Not covered: Pythons
started with `-S`, `-I` or `-E` (they skip `sitecustomize` or `PYTHONPATH`) and Pythons that
cannot import speculators_hybrid (they print a warning when they import speculators).

Examples: `speculators-hybrid run -- torchrun --nproc-per-node 8 scripts/train.py ...`,
`speculators-hybrid run -- speculators train ...`, `speculators-hybrid run -- python -m ...`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Mapping

from speculators_hybrid.usage import refuse

BOOTSTRAP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bootstrap")


def child_env(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` with the bootstrap directory first on PYTHONPATH (once)."""
    env = dict(environ)
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != BOOTSTRAP]
    env["PYTHONPATH"] = os.pathsep.join([BOOTSTRAP, *parts])
    return env


def _plan() -> str:
    from speculators_hybrid.speculators_patches import PATCHER, PATCHES
    from speculators_hybrid.switches import disabled
    from speculators_hybrid.versions import installed

    if disabled():
        return "SPECULATORS_HYBRID_DISABLE is set: no patches"
    version = installed("speculators")
    if version is None:
        return "speculators is not installed here; patches are armed wherever it is imported"
    ids = [p.id for p in PATCHER.select(PATCHES)]
    return f"speculators {version}: patches {', '.join(ids) or 'none needed'}"


def _run(args: argparse.Namespace) -> int:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        return refuse("run", "give a command after --, e.g. run -- torchrun ...")
    if not args.quiet:
        print(f"speculators-hybrid run: {_plan()}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    env = child_env(os.environ)
    if os.sep not in cmd[0] and shutil.which(cmd[0], path=env.get("PATH")) is None:
        return refuse("run", f"{cmd[0]}: command not found", 127)
    try:
        os.execvpe(cmd[0], cmd, env)
    except OSError as exc:
        status = 126 if isinstance(exc, PermissionError) else 127
        return refuse("run", f"cannot run {cmd[0]}: {exc.strerror or exc}", status)
    return 0  # not reached


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "run",
        help="run a speculators command with the speculators patches in every process",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="no start-up line")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")
    parser.set_defaults(func=_run)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="speculators-hybrid")
    add_cli(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["run", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
