"""The acceptance table of a finished loop, from its results folder (accept-*.json).

    python benchmarks/acceptance/table.py RESULTS_DIR

One markdown row per engine, in the loop's order: acceptance per position, acceptance length,
decode tokens/s (all prompts at once; one at a time) and their ratio to the target alone; an
engine that did not start shows the last line of the engine's own error (accept-NAME.cause.txt);
engines served side by side (parallel.txt) show their rates in brackets, not compared; with
train-validation.json (validation.py), the last column is what the drafter's trainer validated:
acceptance at draft position 0 and acceptance length (EAGLE-3: full_acc_0 and 1 + the sum of
full_acc_i; DFlash: position_1_acc and eal, the accepted run of a block plus the bonus token).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ORDER = (
    "target",
    "eagle3",
    "dflash",
    "dflash-1d",
    "dflash-full",
    "dflash-noncausal",
    "eagle3-nonorm",
    "eagle3-shuffled",
    "eagle3-hf32",
    "eagle3-seed1",
    "eagle3-stock",
    "eagle3-stop",
    "dflash-stop",
    "eagle3-fp8",
    "mtp",
    "mtp-nonorm",
    "mtp-random",
    "eagle3-regen",
    "dflash-regen",
    "target-graphs",
    "eagle3-graphs",
)


def trainer_of(name: str, result: dict[str, Any]) -> str:
    """The trainer whose drafter an engine served, from the drafter path the engine recorded
    ($ACC/train-NAME/STEP): eagle3-stock and eagle3-graphs serve eagle3's."""
    folder = Path(result.get("drafter") or "").parent.name
    return folder.removeprefix("train-") if folder.startswith("train-") else name


def validated(trainer: dict[str, Any] | None) -> str:
    """The trainer's last validation: position 0 / acceptance length, or '-'."""
    epochs = (trainer or {}).get("validation_per_epoch") or [{}]
    last = epochs[-1]
    if "full_acc_0" in last:  # EAGLE-3: full_acc_i is the run up to position i
        runs = [v for k, v in sorted(last.items()) if k.startswith("full_acc_")]
        return f"{last['full_acc_0']:.3f} / {1 + sum(runs):.2f}"
    if "eal" in last:  # DFlash
        return f"{last.get('position_1_acc', float('nan')):.3f} / {last['eal']:.2f}"
    return "-"


def row(name: str, r: dict[str, Any], base: dict[str, Any] | None, cause: str, shared: bool) -> str:
    if "error" in r:
        cause = (cause or r["error"]).strip().splitlines()[-1][:160]
        return f"| {name} | not served: `{cause}` | - | - | - |"
    per_pos = ", ".join(f"{v:.3f}" for v in r.get("acceptance_per_position", [])) or "-"
    length = f"{r['acceptance_length']:.2f}" if r.get("acceptance_length") else "-"
    rates = f"{r['batch_tok_s']:,.0f} / {r['serial_tok_s']:,.1f}"
    if shared:  # served while other engines shared the GPU: rates do not compare
        rates, ratio = f"({rates}, GPU shared)", "-"
    elif base and name != "target" and "batch_tok_s" in base:
        batch, serial = (r[k] / base[k] for k in ("batch_tok_s", "serial_tok_s"))
        ratio = f"{batch:.2f}x / {serial:.2f}x"
    else:
        ratio = "-"
    return f"| {name} | {per_pos} | {length} | {rates} | {ratio} |"


def table(folder: Path) -> str:
    found = {p.name[len("accept-") : -len(".json")]: p for p in folder.glob("accept-*.json")}
    names = [n for n in ORDER if n in found] + sorted(set(found) - set(ORDER))
    results = {n: json.loads(found[n].read_text()) for n in names}
    side = folder / "parallel.txt"  # engines the loop ran side by side
    shared = set(side.read_text().split()) if side.exists() else set()
    trained = folder / "train-validation.json"
    trainers = json.loads(trained.read_text()) if trained.exists() else None
    lines = [
        "| engine (k=3) | acceptance per position | length "
        "| decode tok/s, all at once / one at a time | vs target |"
        + (" validated: position 0 / length |" if trainers is not None else ""),
        "|---|---|---|---|---|" + ("---|" if trainers is not None else ""),
    ]
    for name in names:
        base = results.get("target-graphs" if name.endswith("-graphs") else "target")
        cause = folder / f"accept-{name}.cause.txt"
        text = cause.read_text() if cause.exists() else ""
        line = row(name, results[name], base, text, name in shared)
        if trainers is not None:
            line += f" {validated(trainers.get(trainer_of(name, results[name])))} |"
        lines.append(line)
    served = {trainer_of(name, results[name]) for name in names}
    for name in ORDER:
        trainer = (trainers or {}).get(name)
        if trainer is not None and name not in served:  # the loop stopped first
            lines.append(f"| {name} | not served | - | - | - | {validated(trainer)} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print(
            "usage: table.py RESULTS_DIR (a folder with the loop's accept-*.json)", file=sys.stderr
        )
        return 2
    print(table(Path(argv[0])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
