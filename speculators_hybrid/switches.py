"""Environment switches of the plugin: on when set to 1, true or yes, off when set to 0, false
or no (any case); unset (or anything else) is neither."""

from __future__ import annotations

import os
import re

ON = ("1", "true", "yes")
OFF = ("0", "false", "no")


def on(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ON


def off(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in OFF


DISABLE = "SPECULATORS_HYBRID_DISABLE"  # the plugin patches nothing
DISABLED_PATCHES = "SPECULATORS_HYBRID_DISABLED_PATCHES"


def disabled_patches() -> frozenset[str]:
    """Patch ids turned off by SPECULATORS_HYBRID_DISABLED_PATCHES (comma or space separated),
    to see what one patch does; a run without a patch its vLLM needs is not a supported one."""
    return frozenset(re.split(r"[,\s]+", os.environ.get(DISABLED_PATCHES, "").strip())) - {""}
