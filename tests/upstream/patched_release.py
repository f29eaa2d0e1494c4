"""Shared by the patches/ tests: the installed release, its check, a patched copy of it."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from speculators_hybrid import upstream
from speculators_hybrid.registry import base_version
from speculators_hybrid.versions import installed

REPO = Path(__file__).resolve().parents[2]
ROOT = REPO / "patches"


def release(project: str) -> str | None:
    version = installed(project)
    return str(base_version(version)) if version else None


def check_failures(project: str) -> list[str]:
    """Each diff of the installed release that does not apply to it (pristine: from its wheel)."""
    version = release(project)
    assert version is not None
    where, results = upstream.check(ROOT, project, version)
    assert results, f"no diffs for {project} {version} under {ROOT / project}"
    assert where.startswith("installed")
    return [f"{r.diff.name}: {r.message}" for r in results if not r.ok]


def patched(project: str, dest: Path, *path: Path) -> tuple[Path, dict[str, str]]:
    """A copy of the installed package with its release's diffs applied, and an environment
    that imports it (then `path`, then this checkout) with the shim off."""
    version = release(project)
    spec = importlib.util.find_spec(project)
    assert version is not None and spec is not None and spec.submodule_search_locations
    package = Path(list(spec.submodule_search_locations)[0])
    copy = upstream.patched_copy(ROOT, project, version, package, dest)
    search = os.pathsep.join(str(p) for p in (copy.parent, *path, REPO))
    return copy, {**os.environ, "PYTHONPATH": search, "SPECULATORS_HYBRID_DISABLE": "1"}
