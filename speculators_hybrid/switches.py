"""Environment switches of the plugin: on when set to 1, true or yes (any case)."""

from __future__ import annotations

import os

ON = ("1", "true", "yes")


def on(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ON
