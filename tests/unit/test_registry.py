"""The patch framework on real modules written to disk (no vLLM needed)."""

from __future__ import annotations

import importlib
import sys
import textwrap

import pytest

from speculators_hybrid.fingerprint import fingerprint
from speculators_hybrid.registry import Patch, Patcher, PatchError, Target

SOURCE = """
def add(a, b):
    return a + b


class Box:
    def size(self):
        return 3

    @staticmethod
    def kind():
        return "box"
"""


@pytest.fixture
def module_dir(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    names: list[str] = []

    def write(name: str, source: str = SOURCE) -> str:
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        names.append(name)
        return name

    yield write
    for name in names:
        sys.modules.pop(name, None)


def _plus_one(wrapped, instance, args, kwargs):
    return wrapped(*args, **kwargs) + 1


def _tagged(wrapped, instance, args, kwargs):
    return "patched-" + wrapped(*args, **kwargs)


def _prints(name: str) -> dict[str, str]:
    module = importlib.import_module(name)
    prints = {
        "add": fingerprint(module.add),
        "Box.size": fingerprint(vars(module.Box)["size"]),
        "Box.kind": fingerprint(vars(module.Box)["kind"]),
    }
    sys.modules.pop(name)
    return prints


def _patch(module: str, prints: dict[str, str], versions: str = ">=1.0,<2", **over) -> Patch:
    targets = (
        Target(module, "add", _plus_one, (over.get("add", prints["add"]),)),
        Target(module, "Box.size", _plus_one, (prints["Box.size"],)),
        Target(module, "Box.kind", _tagged, (prints["Box.kind"],)),
    )
    return Patch("demo", "proj", versions, "PR 1, released in 2.0", "why", targets)


def _patcher(version: str | None = "1.5") -> Patcher:
    return Patcher(version_of=lambda dist: version)


def test_patches_on_import_whatever_the_order(module_dir):
    name = module_dir("target_a")
    patch = _patch(name, _prints(name))
    patcher = _patcher()
    assert patcher.apply([patch]) == [patch]
    assert name not in sys.modules  # armed, not imported
    module = importlib.import_module(name)
    assert module.add(1, 2) == 4
    assert module.Box().size() == 4
    assert module.Box.kind() == "patched-box"
    assert patcher.applied() == ["demo"]
    patcher.revert()


def test_patches_a_module_already_imported(module_dir):
    name = module_dir("target_b")
    patch = _patch(name, _prints(name))
    module = importlib.import_module(name)
    patcher = _patcher()
    patcher.apply([patch])
    assert module.add(1, 2) == 4
    patcher.revert()


def test_apply_twice_is_a_no_op_and_revert_restores_the_originals(module_dir):
    name = module_dir("target_c")
    patch = _patch(name, _prints(name))
    module = importlib.import_module(name)
    originals = (module.add, vars(module.Box)["size"], vars(module.Box)["kind"])
    patcher = _patcher()
    patcher.apply([patch])
    patcher.apply([patch])
    assert module.add(1, 2) == 4  # wrapped once, not twice
    patcher.revert()
    assert (module.add, vars(module.Box)["size"], vars(module.Box)["kind"]) == originals
    assert module.add(1, 2) == 3 and module.Box.kind() == "box"
    assert patcher.applied() == []
    patcher.apply([patch])  # again after a revert: the module is patched again
    assert module.add(1, 2) == 4 and patcher.applied() == ["demo"]
    patcher.revert()


def test_changed_target_patches_nothing_and_names_function_and_version(module_dir):
    name = module_dir("target_d")
    patch = _patch(name, _prints(name), add="0000000000000000")
    module = importlib.import_module(name)
    size = vars(module.Box)["size"]
    patcher = _patcher("1.7")
    with pytest.raises(PatchError) as err:
        patcher.apply([patch])
    message = str(err.value)
    assert f"{name}:add" in message and "proj 1.7" in message and "0000000000000000" in message
    assert "SPECULATORS_HYBRID_DISABLE=1" in message
    assert module.add(1, 2) == 3 and vars(module.Box)["size"] is size
    assert patcher.applied() == []


def test_failure_in_a_second_module_restores_the_first(module_dir):
    first = module_dir("target_e1")
    second = module_dir("target_e2")
    good = _patch(first, _prints(first))
    bad_prints = _prints(second)
    bad = Patch(
        "bad",
        "proj",
        ">=1",
        "none yet",
        "why",
        (Target(second, "add", _plus_one, ("ffffffffffffffff",)),),
    )
    module = importlib.import_module(first)
    patcher = _patcher()
    patcher.apply([good, bad])
    assert module.add(1, 2) == 4
    with pytest.raises(PatchError):
        importlib.import_module(second)
    assert module.add(1, 2) == 3  # the whole set was rolled back
    assert bad_prints["add"] != "ffffffffffffffff"
    with pytest.raises(PatchError):  # and stays failed in this process
        patcher.apply([good])


def test_missing_target_is_an_error(module_dir):
    name = module_dir("target_f", "def other():\n    return 1\n")
    patch = Patch(
        "gone", "proj", ">=1", "none yet", "why", (Target(name, "add", _plus_one, ("x",)),)
    )
    with pytest.raises(PatchError, match=r"target_f:add does not exist in proj 1.5"):
        _patcher().apply([patch])
        importlib.import_module(name)


def test_inherited_attribute_counts_as_missing(module_dir):
    name = module_dir(
        "target_g", "class A:\n    def f(self):\n        return 1\n\nclass B(A):\n    pass\n"
    )
    patch = Patch(
        "inh", "proj", ">=1", "none yet", "why", (Target(name, "B.f", _plus_one, ("x",)),)
    )
    with pytest.raises(PatchError, match="does not exist"):
        _patcher().apply([patch])
        importlib.import_module(name)


@pytest.mark.parametrize(
    ("version", "needed"),
    [
        ("1.0", True),
        ("1.9.3", True),
        ("1.5+cu130", True),
        ("1.6.dev2", True),
        ("2.0", False),
        ("0.9", False),
        (None, False),
    ],
)
def test_version_gate_retires_at_the_upstream_fix(version, needed):
    patch = Patch("gate", "proj", ">=1.0,<2", "PR 1, released in 2.0", "why", ())
    assert patch.needed_for(version) is needed
    assert _patcher(version).select([patch]) == ([patch] if needed else [])


def test_fingerprint_ignores_blank_lines_and_indentation_but_not_code(module_dir):
    a = module_dir("fp_a", "def f(x):\n    return x + 1\n")
    b = module_dir("fp_b", "class C:\n    def f(x):\n\n        return x + 1   \n")
    c = module_dir("fp_c", "def f(x):\n    return x + 2\n")
    fa = fingerprint(importlib.import_module(a).f)
    assert fa == fingerprint(vars(importlib.import_module(b).C)["f"])
    assert fa != fingerprint(importlib.import_module(c).f)


def test_two_patches_wrap_one_target_in_order_and_revert_cleanly(module_dir):
    name = module_dir("target_stack")
    prints = _prints(name)
    inner = Patch(
        "inner", "proj", ">=1", "none", "why", (Target(name, "add", _plus_one, (prints["add"],)),)
    )
    double = Target(name, "add", lambda w, i, a, k: w(*a, **k) * 2, (prints["add"],))
    outer = Patch("outer", "proj", ">=1", "none", "why", (double,))
    module = importlib.import_module(name)
    original = module.add
    patcher = _patcher()
    patcher.apply([inner, outer])
    assert module.add(1, 2) == 8  # (1 + 2 + 1) * 2: the later patch wraps the earlier one
    assert patcher.applied() == ["inner", "outer"]
    assert patcher.original(outer, double) is not original  # it replaced inner's wrapper
    patcher.revert()
    assert module.add is original


def test_not_strict_a_changed_target_is_recorded_and_nothing_is_patched(module_dir):
    first = module_dir("target_n1")
    second = module_dir("target_n2")
    good = _patch(first, _prints(first))
    changed = Patch(
        "changed", "proj", ">=1", "none yet", "why",
        (Target(second, "add", _plus_one, ("ffffffffffffffff",)),),
    )  # fmt: skip
    module = importlib.import_module(first)
    patcher = Patcher(version_of=lambda dist: "1.5", strict=False)
    patcher.apply([good, changed])
    assert module.add(1, 2) == 4
    assert patcher.verify_all() is patcher.failed  # imports target_n2: no exception
    assert module.add(1, 2) == 3 and patcher.applied() == []
    assert patcher.failed.patch == "changed" and patcher.failed.target == f"{second}:add"
    assert patcher.failed.short() == f"{second}:add is not what patch changed was written for"


def test_verify_all_imports_every_target_module_and_names_one_that_cannot_be(module_dir):
    name = module_dir("target_v")
    patch = _patch(name, _prints(name))
    patcher = Patcher(version_of=lambda dist: "1.5", strict=False)
    patcher.apply([patch])
    assert name not in sys.modules
    assert patcher.verify_all() is None and patcher.applied() == ["demo"]
    patcher.revert()
    gone = Patch(
        "gone", "proj", ">=1", "none yet", "why",
        (Target("no_such_module_here", "add", _plus_one, ("0",)),),
    )  # fmt: skip
    patcher.apply([patch, gone])
    failed = patcher.verify_all()
    assert failed is not None and failed.patch == "gone" and "cannot be imported" in str(failed)
    assert patcher.applied() == [] and importlib.import_module(name).add(1, 2) == 3
    patcher.revert()
