"""The `speculators-hybrid verify` command: argument checks, the sample, streaming output."""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import sys
from collections import Counter
from typing import IO, Any

from speculators_hybrid.usage import refuse
from speculators_hybrid.verify import __doc__ as DOC

DEFAULT_SAMPLE = 32
INSTALL = (
    "pip install './speculators-hybrid[verify]' (the clone's folder; torch, transformers >= 5.6, "
    "tqdm)"
)


class BadInput(Exception):
    """A one-line reason to stop before any file is verified (exit status 2)."""


def _require() -> None:
    missing = []
    for name in ("torch", "transformers", "safetensors", "tqdm"):
        try:
            __import__(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise BadInput(f"needs {', '.join(missing)}: {INSTALL}")


def _files(paths: list[str]) -> list[str]:
    """Every file to choose from; a named file must exist and be safetensors."""
    from safetensors import safe_open

    from speculators_hybrid.hidden_files import find_files

    for path in paths:
        if not os.path.exists(path):
            raise BadInput(f"{path} does not exist")
        if os.path.isdir(path):
            continue
        try:
            with safe_open(path, framework="pt"):
                pass
        except Exception:  # noqa: BLE001
            raise BadInput(f"{path} is not a safetensors file") from None
    found = list(find_files(paths))
    if not found:
        raise BadInput(f"no .safetensors files under {', '.join(paths)}")
    return found


def choose(files: list[str], sample: int | None, fraction: float | None, seed: int) -> list[str]:
    """A seeded random sample, in the files' own order."""
    count = math.ceil(fraction * len(files)) if fraction is not None else sample or DEFAULT_SAMPLE
    count = min(len(files), count)
    picked = set(random.Random(seed).sample(range(len(files)), count))
    return [f for i, f in enumerate(files) if i in picked]


def _device(name: str | None) -> str:
    import importlib.util

    import torch

    if name is None:
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name != "cpu" and not re.fullmatch(r"cuda(:\d+)?", name):
        raise BadInput(f"--device {name}: verify runs on cpu or cuda[:N]")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise BadInput(f"--device {name}: torch sees no CUDA device here; use --device cpu")
    if name == "cpu":
        kernels = [p for p in ("fla", "causal_conv1d") if importlib.util.find_spec(p)]
        if kernels:
            raise BadInput(
                f"--device cpu: transformers would run the GPU-only {', '.join(kernels)} kernels "
                "installed here; use --device cuda or a virtualenv without them"
            )
    else:  # float32 truth without TF32
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    return name


def _model_ids(model: str, ids: list[int] | None) -> None:
    from speculators_hybrid.extraction import id_problems
    from speculators_hybrid.launcher.target import layer_count
    from speculators_hybrid.verify.capture import ModelError, read_config, text_config

    if not os.path.isdir(model):
        raise BadInput(f"--model {model} is not a folder: give the model's folder")
    try:
        n = layer_count(text_config(read_config(model)))
    except ModelError as exc:
        raise BadInput(str(exc)) from None
    if ids is not None and isinstance(n, int):
        problems = id_problems(ids, n)
        if problems:
            raise BadInput(f"--ids {ids}: {'; '.join(problems)} (the model has {n} layers)")


def file_line(result: Any) -> str:
    worst = result.worst()
    written = f"{result.backend} backend, " if result.backend else ""
    if result.ok:
        return (
            f"ok    {result.path}  {written}{result.tokens} tokens, ids {result.layer_ids}: "
            f"worst id {worst.layer_id} token {worst.token}: {worst.similarity:.5f} (floor "
            f"{worst.floor:.5f}, limit {worst.limit:.5f})"
        )
    return f"FAIL  {result.path}  {written}" + "; ".join(result.reasons())


def summarize(results: list[Any], total: int, settings: dict[str, Any]) -> dict[str, Any]:
    from speculators_hybrid.verify import rule
    from speculators_hybrid.verify.files import finite

    per_id: dict[int, dict[str, Any]] = {}
    for result in results:
        for r in result.ids:
            entry = per_id.setdefault(
                r.layer_id,
                {"files": 0, "failed": 0, "worst": 1.0, "worst_floor": 1.0, "worst_excess": 0.0},
            )
            entry["files"] += 1
            entry["failed"] += not r.ok
            entry["worst"] = min(entry["worst"], r.similarity)
            entry["worst_floor"] = min(entry["worst_floor"], r.floor)
            entry["worst_excess"] = max(entry["worst_excess"], r.excess)
    for entry in per_id.values():  # a NaN file: -inf similarity, inf excess; JSON has no inf
        for key in ("worst", "worst_floor", "worst_excess"):
            entry[key] = finite(entry[key])
    failed = [r for r in results if not r.ok]
    return {
        **settings,
        "files_found": total,
        "verified": len(results),
        "ok": len(results) - len(failed),
        "failed": len(failed),
        "backends": dict(Counter(r.backend for r in results if r.backend)),
        "rule": {
            "k": rule.K,
            "eps": rule.EPS,
            "passes_when": "per id: 1 - s_file <= k * (1 - s_floor) + eps (worst tokens)",
            "fp8_floor": "the floor's forward stored as fp8 and read back, as the trainer does",
        },
        "per_id": {str(i): per_id[i] for i in sorted(per_id)},
    }


def print_summary(summary: dict[str, Any], results: list[Any], out: IO[str]) -> None:
    print("per id (worst over the files; excess > 1 fails):", file=out)
    print(
        f"  {'id':>4} {'files':>6} {'failed':>6} {'worst':>9} {'floor':>9} {'excess':>7}", file=out
    )
    for i, e in summary["per_id"].items():
        worst, floor, excess = (
            "nan" if e[k] is None else f"{e[k]:.{d}f}"
            for k, d in (("worst", 5), ("worst_floor", 5), ("worst_excess", 2))
        )
        print(
            f"  {i:>4} {e['files']:>6} {e['failed']:>6} {worst:>9} {floor:>9} {excess:>7}",
            file=out,
        )
    print(
        f"verify: {summary['ok']} of {summary['verified']} files pass ({summary['files_found']} "
        f"found, seed {summary['seed']}), {summary['failed']} failed; written by backend: "
        + (", ".join(f"{b} ({n})" for b, n in sorted(summary["backends"].items())) or "-"),
        file=out,
    )
    print_failures(results, out)


def print_failures(results: list[Any], out: IO[str]) -> None:
    for result in results:
        if not result.ok:
            print(f"FAILED {result.path}: {'; '.join(result.reasons())}", file=out)


def verify_paths(
    paths: list[str],
    model: str,
    *,
    sample: int | None = None,
    fraction: float | None = None,
    seed: int = 0,
    ids: list[int] | None = None,
    device: str | None = None,
    dtype: str = "auto",
    as_json: bool = False,
    out: IO[str] | None = None,
) -> tuple[int, dict[str, Any] | None]:
    """Verify a sample of the files under `paths`: (exit status, the JSON document or None).

    Text: one line per file as it is done, then the summary, on `out`. JSON (`as_json`): nothing
    on `out`; the document is returned and the failures are named on stderr.
    """
    try:
        _require()
        files = _files(paths)
        _model_ids(model, ids)
        where = _device(device)
        from tqdm import tqdm

        from speculators_hybrid.verify.capture import ModelError
        from speculators_hybrid.verify.files import Verifier

        chosen = choose(files, sample, fraction, seed)
        try:
            verifier = Verifier(model, where, None if dtype == "auto" else dtype, ids)
        except ModelError as exc:
            raise BadInput(str(exc)) from None
    except BadInput as exc:
        return refuse("verify", str(exc)), None
    out = out or sys.stdout
    settings = {"model": model, "device": where, "dtype": dtype, "seed": seed}
    if not as_json:
        from speculators_hybrid.verify import rule

        floor = dtype if dtype != "auto" else "each file's dtype"
        print(
            f"verify: {len(chosen)} of {len(files)} files (seed {seed}) against {model} on "
            f"{where}: float32 truth, floor in {floor}; per id a file passes when 1 - s <= "
            f"{rule.K:g} x (1 - s_floor) + {rule.EPS:g} (s: similarity at the worst token)",
            file=out,
        )
    results = []
    bar = tqdm(chosen, desc="verify", unit="file", file=sys.stderr, disable=None)
    for path in bar:
        result = verifier.verify(path)
        results.append(result)
        bar.set_postfix(failed=sum(not r.ok for r in results))
        if not as_json:
            tqdm.write(file_line(result), file=out)
            out.flush()  # each file's line as it is done, also into a pipe or a log
    bar.close()
    summary = summarize(results, len(files), settings)
    code = 1 if summary["failed"] else 0
    if as_json:
        print_failures(results, sys.stderr)
        return code, {"summary": summary, "files": [r.to_json() for r in results]}
    print_summary(summary, results, out)
    return code, None


def _verify(args: argparse.Namespace) -> int:
    if args.sample is not None and args.sample < 1:
        return refuse("verify", "--sample must be at least 1")
    if args.fraction is not None and not 0 < args.fraction <= 1:
        return refuse("verify", "--fraction must be within (0, 1]")
    code, doc = verify_paths(
        args.paths,
        args.model,
        sample=args.sample,
        fraction=args.fraction,
        seed=args.seed,
        ids=args.ids,
        device=args.device,
        dtype=args.dtype,
        as_json=args.json,
    )
    if doc is not None:
        json.dump(doc, sys.stdout)
        print()
    return code


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "verify",
        help="recompute a sample of hidden-state files with the model and compare",
        description=DOC,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("paths", nargs="+", metavar="PATH", help="files or folders of them")
    parser.add_argument("--model", required=True, metavar="MODEL_DIR", help="the target's folder")
    size = parser.add_mutually_exclusive_group()
    size.add_argument(
        "--sample", type=int, metavar="N", help=f"files to verify (default {DEFAULT_SAMPLE})"
    )
    size.add_argument("--fraction", type=float, metavar="F", help="share of the files, (0, 1]")
    parser.add_argument("--seed", type=int, default=0, metavar="S", help="the sample's (default 0)")
    parser.add_argument(
        "--ids",
        type=int,
        nargs="+",
        metavar="I",
        help="layer ids of every file (default: each file's metadata, else [2, n//2, n-3, n])",
    )
    parser.add_argument("--device", help="cuda[:N] or cpu (default: cuda if there is one)")
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "bfloat16", "float16", "float32"],
        help="the dtype the server ran in, for the floor (default auto: each file's dtype)",
    )
    parser.add_argument("--json", action="store_true", help="summary and per-file report as JSON")
    parser.set_defaults(func=_verify)
