"""The trainers' own validation, read from the loop's trainer logs (logs/train-NAME.log).

    python benchmarks/acceptance/validation.py LOGS_DIR > RESULTS_DIR/train-validation.json

speculators' trainer logs each validation epoch between "Validation epoch N/M started" and
"... completed" as `val/KEY_epoch=VALUE` pairs (EAGLE-3: loss_i, full_acc_i, cond_acc_i per draft
position; DFlash: full_acc, position_i_acc, eal). Per trainer: the last logged step, the step
limit and each validation epoch's values. A log with no validation epoch gives an empty list.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

VALUE = re.compile(r"val/([A-Za-z0-9_]+?)_epoch=([-+0-9.eE]+)")
EPOCH = re.compile(r"(?<![/\w])epoch=(\d+)")


def last_int(pattern: str, text: str) -> int | None:
    found = re.findall(pattern, text)
    return int(found[-1]) if found else None


def read_log(text: str) -> dict[str, Any]:
    epochs: list[dict[str, Any]] = []
    block: list[str] | None = None
    for line in text.splitlines():
        if re.search(r"Validation epoch \d+/\d+ started", line):
            block = []
        elif re.search(r"Validation epoch \d+/\d+ completed", line) and block is not None:
            joined = "\n".join(block)
            values: dict[str, Any] = {k: float(v) for k, v in VALUE.findall(joined)}
            epoch = EPOCH.findall(joined)
            if epoch:
                values["epoch"] = int(epoch[-1])
            epochs.append(values)
            block = None
        elif block is not None:
            block.append(line)
    return {
        "last_logged_step": last_int(r"global_step=(\d+)", text),
        "max_steps": last_int(r"trainer/max_steps=(\d+)", text),
        "validation_per_epoch": epochs,
    }


def read_logs(folder: Path) -> dict[str, dict[str, Any]]:
    return {
        log.name[len("train-") : -len(".log")]: read_log(log.read_text(errors="replace"))
        for log in sorted(folder.glob("train-*.log"))
    }


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print(
            "usage: validation.py LOGS_DIR (a folder with the loop's train-*.log)", file=sys.stderr
        )
        return 2
    print(json.dumps(read_logs(Path(argv[0])), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
