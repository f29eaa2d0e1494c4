"""The releases the test matrix runs, and how deeply (scripts/matrix.py builds tox.ini from it).

`full`: the whole CPU suite, and the CPU suite again against a copy of the release with its
diffs in patches/ applied (shim off). `decisive`: the tests that decide whether the plugin
serves the release (plugin loading, fingerprints, vLLM's planning with and without extraction
on any host, scheduler and connector, text-only registration, the diffs apply); the slowest
tests (marker `full_tier`) run on the full releases only.
"""

from __future__ import annotations

FULL = "full"
DECISIVE = "decisive"

VLLM: dict[str, str] = {
    "0.20.0": DECISIVE,
    "0.20.1": FULL,
    "0.20.2": DECISIVE,
    "0.21.0": FULL,
    "0.22.0": DECISIVE,
    "0.22.1": FULL,
    "0.23.0": DECISIVE,
    "0.24.0": FULL,
    "0.25.0": FULL,
    "0.25.1": DECISIVE,
    "0.26.0": DECISIVE,
    "0.27.0": DECISIVE,
    "0.27.1": DECISIVE,
    "0.28.0": DECISIVE,
    "0.29.0": FULL,
    "0.30.0": DECISIVE,
    "0.31.0": DECISIVE,
    "0.32.0": DECISIVE,
    "0.33.0": FULL,
    "0.34.0": DECISIVE,
}
OLDEST, NEWEST = next(iter(VLLM)), next(reversed(VLLM))  # VLLM is in release order


def tested_range() -> str:
    """The vLLM releases the matrix runs, as a user reads them: '<OLDEST> to <NEWEST>'."""
    return f"{OLDEST} to {NEWEST}"


# speculators releases, each tested beside this vLLM.
SPECULATORS: tuple[str, ...] = ("0.5.0", "0.7.0", "0.8.1", "0.9.0")
SPECULATORS_VLLM = "0.20.1"

# hs-connectors (speculators' hidden-state backends, backends.py) in every vLLM env: the release
# speculators 0.9.0 pins.
HS_CONNECTORS = "0.9.0"

# Releases whose env also runs tests/cli (the CLI as a subprocess with vLLM: doctor's plans).
CLI: tuple[str, ...] = ("0.20.1", "0.25.0", "0.33.0")
