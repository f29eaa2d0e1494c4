"""The `speculators-hybrid` command."""

from __future__ import annotations

import argparse
import sys

from speculators_hybrid import __version__, check, doctor, launch, run, switches, upstream
from speculators_hybrid.accept import command as accept_command
from speculators_hybrid.plugin import disabled, unknown_disabled, vllm_patches
from speculators_hybrid.registry import Patch, Patcher
from speculators_hybrid.usage import refuse
from speculators_hybrid.verify import command as verify_command
from speculators_hybrid.versions import installed

DESCRIPTION = (
    "Hidden-state extraction for speculators' drafter training on hybrid target models "
    "(attention mixed with Gated DeltaNet / Mamba / conv state layers: Qwen3.5/3.6, "
    "Qwen3-Next, Nemotron-H, ...). Installed next to vLLM it is a vLLM plugin that patches "
    "every vLLM process; these commands plan the KV cache on a CPU (doctor), start the server "
    "(launch), check and verify the files it writes (check, verify), run speculators with its "
    "patches (run), measure a trained drafter's acceptance (accept) and show the patches "
    "(patches)."
)
PATCHES = (
    "The runtime patches of vLLM and speculators: `list` says which apply to the releases "
    "installed here; `check`, `unpack` and `export` work on their source diffs under patches/."
)


def all_patches() -> tuple[Patch, ...]:
    from speculators_hybrid.speculators_patches import PATCHES

    return (*vllm_patches(), *PATCHES)


def _patches_list(args: argparse.Namespace) -> int:
    problem = unknown_disabled()
    if problem:
        return refuse("patches", problem)
    off = switches.disabled_patches()
    print(
        f"vllm {installed('vllm') or 'not installed'}; "
        f"speculators {installed('speculators') or 'not installed'}"
        + ("; SPECULATORS_HYBRID_DISABLE is set" if disabled() else "")
    )
    for project in ("vllm", "speculators"):
        if not installed(project):
            print(
                f"{project} is not installed here: its patches apply where it runs, to the "
                "versions below (run `speculators-hybrid patches list` there)"
            )
    doctor.quiet_vllm(args.verbose)  # vLLM's import logs: stderr, and only with -v
    if installed("vllm") and _stand_in_torchvision():
        print(
            "torchvision cannot be imported here (a CPU or uv venv): vLLM's modules are read "
            "with an inert stand-in for it, to check the fingerprints"
        )
    for patch in all_patches():
        needed = patch.needed_for(installed(patch.project))
        state = "applies here" if needed else "not needed here"
        if installed(patch.project) is None:  # not "not needed": the versions say where
            state = f"{patch.project} not installed here"
        if patch.id in off:
            state = f"{state}; off: {switches.DISABLED_PATCHES}"
        print(f"\n{patch.id}  [{state}]")
        print(f"  versions: {patch.project} {patch.versions}")
        print(f"  upstream: {patch.fixed_upstream}")
        for target in patch.targets:
            scope = f" ({patch.project} {target.versions})" if target.versions else ""
            print(f"  target:   {target.name}{scope}")
        for arch, path in getattr(patch, "models", ()):  # a Registration: nothing wrapped
            print(f"  registers: {arch} -> {path}")
        if needed:
            print(f"  check:    {_check(patch)}")
    return 0


def _stand_in_torchvision() -> bool:
    """cpu.stand_in_torchvision where torchvision cannot load; whether it was needed."""
    from speculators_hybrid import cpu

    cpu.stand_in_torchvision()
    return cpu.STANDINS in sys.path


def _check(patch: Patch) -> str:
    import importlib

    from speculators_hybrid.model_registration import Registration, check
    from speculators_hybrid.registry import PatchError

    if isinstance(patch, Registration):
        return check(patch)
    checker = Patcher(version_of=installed)
    try:
        for target in patch.targets_for(installed(patch.project)):
            checker.verify(patch, target, importlib.import_module(target.module))
    except PatchError as exc:
        return f"FAILS: {exc}"
    except ImportError as exc:
        return f"cannot import target: {exc}"
    return "every target matches its fingerprint"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="speculators-hybrid", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    patches = sub.add_parser(
        "patches", help="the patches and whether they apply here", description=PATCHES
    )
    patches_sub = patches.add_subparsers(dest="action", required=True)
    listing = patches_sub.add_parser(
        "list",
        help="each patch: targets, versions, upstream fix, whether it applies here",
        description="Each patch with its targets, versions and upstream fix; for those that "
        "apply to the installed vLLM / speculators, whether every target matches its "
        "fingerprint (so the plugin would patch it).",
    )
    listing.add_argument(
        "-v", "--verbose", action="store_true", help="show vLLM's own logs (on stderr)"
    )
    listing.set_defaults(func=_patches_list)
    upstream.add_cli(patches_sub)  # check, unpack, export: the diffs under patches/

    doctor.add_cli(sub)
    launch.add_cli(sub)
    check.add_cli(sub)
    run.add_cli(sub)
    verify_command.add_cli(sub)
    accept_command.add_cli(sub)
    return parser


def _chosen(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)command's own parser, for its usage line."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            name = getattr(args, action.dest, None)
            if name in action.choices:
                return _chosen(action.choices[name], args)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # said by the subcommand's parser, with its usage, not the top-level one
        _chosen(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
