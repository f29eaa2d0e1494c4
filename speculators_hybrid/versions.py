"""Installed versions of the projects we patch, read from package metadata (no imports)."""

from __future__ import annotations

from functools import cache
from importlib import metadata


@cache
def installed(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None
