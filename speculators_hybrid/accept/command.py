"""The `speculators-hybrid accept` command: input checks, one engine process a run, the table."""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from speculators_hybrid.accept import __doc__ as DOC
from speculators_hybrid.usage import refuse

# vLLM's speculative methods for each `speculators_model_type` a drafter's config can name
METHODS = {"eagle3": "eagle3", "dflash": "dflash", "mtp": "mtp"}
PAST_END_NOTE = 0.05  # a share of tokens after the replies' ends worth a line
ENGINE = [sys.executable, "-m", "speculators_hybrid.accept.engine"]  # one engine a process


class BadInput(Exception):
    """A one-line reason to stop before any engine starts (exit status 2)."""


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number above 0")
    return value


def _above_zero(what: str, high: float = math.inf) -> Callable[[str], float]:
    """An argparse type: a number in (0, high], else `what` it must be."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = 0.0
        if not 0 < value <= high:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
        return value

    return parse


def _target(raw: str) -> str:
    path = Path(raw)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise BadInput(f"{raw} has no config.json: give the target model's folder")
        return str(path)
    if path.exists():
        raise BadInput(f"{raw} is a file: give the target model's folder")
    if raw.count("/") == 1 and not raw.startswith((".", "/")):
        return raw  # a model id on the Hugging Face hub; vLLM and transformers fetch it
    raise BadInput(f"{raw} does not exist: give the target model's folder")


def _checkpoint(raw: str) -> Path:
    """The drafter's folder; a training output with several checkpoints is named, not guessed."""
    path = Path(raw)
    if not path.is_dir():
        raise BadInput(f"--drafter {raw} is not a folder: give a checkpoint folder of the drafter")
    if (path / "config.json").is_file():
        return path
    names = [p.name for p in path.iterdir() if (p / "config.json").is_file()]
    if not names:
        raise BadInput(f"--drafter {raw} holds no config.json: give a checkpoint folder")
    # numbered saves in their order, then the others (speculators' checkpoint_best)
    saved = sorted(names, key=lambda n: (0, int(n), "") if n.isdigit() else (1, 0, n))
    numbered = [n for n in saved if n.isdigit()]
    last = f"{raw.rstrip('/')}/{(numbered or saved)[-1]}"
    raise BadInput(
        f"--drafter {raw} holds {len(saved)} checkpoints ({', '.join(saved)}): "
        f"name one, e.g. --drafter {last}"
    )


def _method(drafter: Path, given: str) -> str:
    if given != "auto":
        return given
    try:
        config = json.loads((drafter / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise BadInput(f"{drafter}/config.json cannot be read ({exc}): pass --method") from None
    kind = config.get("speculators_model_type")
    if kind not in METHODS:
        raise BadInput(
            f"{drafter}/config.json names no drafter type this command knows "
            f"(speculators_model_type: {kind!r}): pass --method {'|'.join(METHODS)}"
        )
    return METHODS[kind]


def _heldout(raw: str) -> Path:
    path = Path(raw)
    if not path.is_file():
        raise BadInput(f"{raw} is not a file: give held-out chats as jsonl")
    usage = (
        'speculators\' chats, one a line: {"conversations": [{"role": "user", "content": "..."}'
        ", ...]}"
    )
    count = 0
    with path.open() as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                conv = json.loads(line)["conversations"]
                first = conv[0]
                ok = isinstance(first, dict) and bool(first.get("content") or first.get("value"))
            except (ValueError, KeyError, IndexError, TypeError):
                ok = False
            if not ok:
                raise BadInput(f"{raw} line {number} is not one of {usage}")
            count += 1
    if not count:
        raise BadInput(f"{raw} holds no chats: give {usage}")
    return path


def _engine(args: argparse.Namespace, out: Path, name: str, drafter: list[str]) -> dict[str, Any]:
    """One engine in its own process; its report (with `error` if it did not start)."""
    report, log = out / f"{name}.json", out / f"{name}.log"
    command = [*ENGINE, args.target, str(args.heldout), str(report), *drafter]
    command += ["--k", str(args.k), "--prompts", str(args.prompts)]
    command += ["--max-tokens", str(args.max_tokens), "--serial", str(args.serial)]
    command += ["--gpu-memory-utilization", str(args.gpu_memory_utilization)]
    command += ["--max-model-len", str(args.max_model_len)]
    command += ["--kv-cache-gib", str(args.kv_cache_gib)]
    command += ["--eager"] if args.eager else []
    command += ["--stop-at-end"] if args.stop_at_end else []
    print(f"accept: {name}: one engine (its log: {log})", flush=True)
    with log.open("w") as sink:
        rc = subprocess.run(command, stdout=sink, stderr=subprocess.STDOUT).returncode
    if report.is_file():
        return dict(json.loads(report.read_text()))
    return {"error": f"the engine exited {rc} without a report"}


def _cause(log: Path) -> str:
    """The last error line of an engine's log: vLLM's engine core logs the root cause there,
    while the front end raises only "Engine core initialization failed"."""
    lines = log.read_text(errors="replace").splitlines() if log.is_file() else []
    found = [line.strip() for line in lines if re.search(r"\w(Error|Exception)\b:", line)]
    return found[-1] if found else ""


def _ratio(a: float | None, b: float | None) -> str:
    return f" ({a / b:.2f}x)" if a and b else ""


def table(runs: dict[str, dict[str, Any]]) -> str:
    base = runs.get("target", {})
    rows = [("run", "acceptance per position", "length", "tok/s, all at once", "one at a time")]
    for name, r in runs.items():
        per_pos = " ".join(f"{v:.3f}" for v in r.get("acceptance_per_position") or []) or "-"
        length = f"{r['acceptance_length']:.2f}" if r.get("acceptance_length") else "-"
        batch, serial = r.get("batch_tok_s"), r.get("serial_tok_s")
        ratios = name != "target"
        rows.append(
            (
                name,
                per_pos,
                length,
                f"{batch:,.0f}" + (_ratio(batch, base.get("batch_tok_s")) if ratios else ""),
                f"{serial:,.1f}" + (_ratio(serial, base.get("serial_tok_s")) if ratios else ""),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows)
    return "\n".join(line.rstrip() for line in lines)


def _require() -> None:
    import importlib.util

    missing = [m for m in ("vllm", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        need = " and ".join(missing)
        raise BadInput(f"needs {need} here: run it in the target server's environment")


def run(args: argparse.Namespace) -> int:
    try:
        _require()
        args.target = _target(args.target)
        args.heldout = _heldout(args.heldout)
        drafter = _checkpoint(args.drafter)
        method = _method(drafter, args.method)
        out = Path(args.out)
        if (out / "report.json").exists():
            raise BadInput(f"{out} already holds a report: pass another --out or move it away")
        if out.exists() and not out.is_dir():
            raise BadInput(f"--out {out} is a file: give a folder")
        out.mkdir(parents=True, exist_ok=True)
    except BadInput as exc:
        return refuse("accept", str(exc))
    runs: dict[str, dict[str, Any]] = {}
    plan: list[tuple[str, list[str]]] = [] if args.no_baseline else [("target", [])]
    plan.append(("drafter", ["--drafter", str(drafter), "--method", method]))
    for name, extra in plan:
        runs[name] = _engine(args, out, name, extra)
        if "error" in runs[name]:
            error = _cause(out / f"{name}.log") or runs[name]["error"].splitlines()[-1]
            print(f"accept: {name}: the engine failed: {error[:300]} (log: {out}/{name}.log)")
            return 1
    report = {"target": args.target, "drafter": str(drafter), "method": method, "k": args.k}
    report["runs"] = runs
    (out / "report.json").write_text(json.dumps(report, indent=2))
    print(table(runs))
    past = runs["drafter"].get("past_end_share") or 0
    if past >= PAST_END_NOTE:  # acceptance there is measured on text nobody trained on
        print(
            f"accept: {past:.0%} of the tokens came after a reply's end-of-turn token; "
            "--stop-at-end measures the replies alone"
        )
    print(f"accept: report in {out}/report.json")
    return 0


def add_cli(sub: Any) -> None:
    parser = sub.add_parser(
        "accept",
        help="serve the target alone and with a trained drafter: acceptance and decode rates",
        description=DOC,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("target", help="the target model's folder (or a hub id)")
    parser.add_argument("heldout", help="held-out chats, speculators' conversations jsonl")
    parser.add_argument("--drafter", required=True, help="a checkpoint folder of the drafter")
    parser.add_argument(
        "--method", default="auto", choices=["auto", *METHODS], help="default: from its config"
    )
    parser.add_argument("--k", type=_positive, default=3, help="draft tokens a step (3)")
    parser.add_argument("--prompts", type=_positive, default=64, help="held-out prompts (64)")
    parser.add_argument("--max-tokens", type=_positive, default=128, help="tokens each (128)")
    parser.add_argument(
        "--serial",
        type=_positive,
        default=8,
        help="of those prompts, how many run again one at a time for decode tokens/s (8)",
    )
    parser.add_argument(
        "--max-model-len", type=_positive, default=2048, help="the engines' context (2048)"
    )
    parser.add_argument(
        "--kv-cache-gib",
        type=_above_zero("a number of GiB above 0"),
        default=4.0,
        help="each engine's KV cache",
    )
    parser.add_argument(
        "--gpu-memory-utilization",
        type=_above_zero("a fraction in (0, 1]", 1.0),
        default=0.9,
        help="vLLM's, each engine (0.9)",
    )
    parser.add_argument("--eager", action="store_true", help="no CUDA graphs")
    parser.add_argument("--no-baseline", action="store_true", help="skip the target alone")
    parser.add_argument(
        "--stop-at-end",
        action="store_true",
        help="stop each reply at its end-of-turn token (default: --max-tokens each)",
    )
    parser.add_argument(
        "--out", default="accept-report", help="folder for the reports (accept-report)"
    )
    parser.set_defaults(func=run)
