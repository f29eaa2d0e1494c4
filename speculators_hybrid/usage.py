"""The one form of a refusal on every command: `speculators-hybrid CMD: error: WHAT`, one line on
stderr, and the exit status that goes with it (2: bad input)."""

from __future__ import annotations

import sys


def refuse(command: str, message: str, status: int = 2) -> int:
    print(f"speculators-hybrid {command}: error: {message}", file=sys.stderr)
    return status
