"""Environment switches of the plugin: on when set to 1, true or yes, off when set to 0, false
or no (any case); unset (or anything else) is neither."""

from __future__ import annotations

import os

ON = ("1", "true", "yes")
OFF = ("0", "false", "no")


def on(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ON


def off(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in OFF
