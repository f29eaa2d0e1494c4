"""tox.ini and the locks are what scripts/matrix.py makes from speculators_hybrid/support.py."""

from __future__ import annotations

import importlib.util
import sys
from functools import cache
from pathlib import Path

from speculators_hybrid import support

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "matrix.py"


@cache
def _matrix():
    spec = importlib.util.spec_from_file_location("matrix", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["matrix"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_tox_ini_and_every_lock_are_up_to_date():
    assert _matrix().problems() == []


def test_every_release_has_an_env_that_installs_it_from_its_lock():
    matrix = _matrix()
    for release in support.VLLM:
        lock = matrix.LOCKS / f"vllm-{release}.txt"
        assert f"vllm=={release}\n" in lock.read_text()
        assert "torch==2.13.0+cpu\n" in lock.read_text()  # the override, not a CUDA build


def test_a_stale_tox_ini_is_reported(tmp_path, monkeypatch):
    matrix = _matrix()
    (tmp_path / "tox.ini").write_text(matrix.tox_ini().replace("vllm-0.24.0", "vllm024"))
    (tmp_path / "README.md").write_text((matrix.ROOT / "README.md").read_text())
    monkeypatch.setattr(matrix, "ROOT", tmp_path)
    assert any("tox.ini differs" in p for p in matrix.problems())


def test_a_lock_made_for_other_requirements_is_reported(tmp_path, monkeypatch):
    matrix = _matrix()
    for lock in matrix.LOCKS.iterdir():
        (tmp_path / lock.name).write_text(lock.read_text())
    (tmp_path / "unit.txt").write_text("# old\npytest==7.0\n")
    monkeypatch.setattr(matrix, "LOCKS", tmp_path)
    assert any("unit.txt was made for other requirements" in p for p in matrix.problems())
