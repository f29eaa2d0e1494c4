"""`speculators-hybrid launch`: speculators' `launch_vllm.py` (any generation) or a built-in
one, adjusted for hybrid targets and exec'd in place (same PID)."""

from __future__ import annotations


class LaunchError(Exception):
    """Bad input or a launcher we cannot use: printed as one line, exit code 2."""
