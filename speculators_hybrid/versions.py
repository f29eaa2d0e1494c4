"""Installed versions of the projects we patch, read from package metadata (no imports)."""

from __future__ import annotations

from functools import lru_cache
from importlib import metadata


@lru_cache(maxsize=None)
def installed(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None
