"""Real speculators releases (tox envs speculators-0.5.0 ... 0.9.0); skipped where none is."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("speculators")

from packaging.version import Version  # noqa: E402

from speculators_hybrid.speculators_patches import PATCHER, PATCHES  # noqa: E402
from speculators_hybrid.versions import installed  # noqa: E402

VERSION = Version(Version(installed("speculators") or "0").base_version)
# speculators 0.5.0's DFlash trains on hard targets: it has no verifier norm.
ALGORITHMS = ("eagle3", "dflash") if VERSION >= Version("0.6.0") else ("eagle3",)
ACCEPTANCE = Path(__file__).resolve().parents[2] / "benchmarks" / "acceptance"


def acceptance_script(name: str) -> Any:
    """benchmarks/acceptance/NAME.py, imported by path (the folder is no package on the path)."""
    spec = importlib.util.spec_from_file_location(name, ACCEPTANCE / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def patched() -> Iterator[None]:
    """The speculators patches applied in this process, as `run`'s bootstrap applies them."""
    PATCHER.revert()
    PATCHER.apply(PATCHES)
    yield
    PATCHER.revert()


@pytest.fixture
def unpatched() -> Iterator[None]:
    PATCHER.revert()
    yield


@pytest.fixture(scope="session")
def verifiers(tmp_path_factory):
    """model_type -> (tiny verifier directory, its final-norm weight), written once."""
    from tiny_models import write_verifier

    root = tmp_path_factory.mktemp("verifiers")
    made: dict = {}

    def get(model_type: str):
        if model_type not in made:
            made[model_type] = write_verifier(root, model_type)
        return made[model_type]

    return get
