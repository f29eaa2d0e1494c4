"""The `speculators-hybrid` command."""

from __future__ import annotations

import argparse
import sys

from speculators_hybrid import check, launch, run, upstream
from speculators_hybrid.plugin import disabled, vllm_patches
from speculators_hybrid.registry import Patch, Patcher
from speculators_hybrid.verify import command as verify_command
from speculators_hybrid.versions import installed


def all_patches() -> tuple[Patch, ...]:
    from speculators_hybrid.speculators_patches import PATCHES

    return (*vllm_patches(), *PATCHES)


def _patches_list(_: argparse.Namespace) -> int:
    print(
        f"vllm {installed('vllm') or 'not installed'}; "
        f"speculators {installed('speculators') or 'not installed'}"
        + ("; SPECULATORS_HYBRID_DISABLE is set" if disabled() else "")
    )
    for patch in all_patches():
        needed = patch.needed_for(installed(patch.project))
        state = "applies here" if needed else "not needed here"
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


def _doctor(args: argparse.Namespace) -> int:
    from speculators_hybrid import doctor

    if args.model is None and not args.demo:
        print("doctor: give a model or config directory, or --demo", file=sys.stderr)
        return 2
    return doctor.run(
        None if args.demo else args.model,
        tuple(args.ids) if args.ids else None,
        args.tp,
        args.max_model_len,
        args.memory,
        args.prefix_caching,
        args.json,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="speculators-hybrid", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    patches = sub.add_parser("patches", help="the patches and whether they apply here")
    patches_sub = patches.add_subparsers(dest="action", required=True)
    patches_sub.add_parser("list").set_defaults(func=_patches_list)
    upstream.add_cli(patches_sub)  # check, unpack, export: the diffs under patches/

    doc = sub.add_parser("doctor", help="vLLM's KV-cache plan for extraction, with and without us")
    doc.add_argument("model", nargs="?", help="model or config directory (config.json is enough)")
    doc.add_argument(
        "--demo",
        action="store_true",
        help="use a built-in Qwen3.6-27B-like hybrid config (no network, no weights)",
    )
    doc.add_argument(
        "--ids",
        type=int,
        nargs="+",
        help="target layer ids (default: speculators' [2, n//2, n-3, n])",
    )
    doc.add_argument("--tp", type=int, default=1)
    doc.add_argument("--max-model-len", type=int, default=262144)
    doc.add_argument("--memory", type=float, default=256.0, help="KV-cache memory in GiB")
    doc.add_argument("--prefix-caching", action="store_true")
    doc.add_argument("--json", action="store_true")
    doc.set_defaults(func=_doctor)

    launch.add_cli(sub)
    check.add_cli(sub)
    run.add_cli(sub)
    verify_command.add_cli(sub)

    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
