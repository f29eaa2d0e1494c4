"""Fingerprints read from code objects are the ones `inspect.getsource` gives, on real vLLM.

`fingerprint` takes a function's lines from its code object (fast) instead of tokenizing it
with `inspect.getsource`; the constants in the patches were computed from `inspect`, so the
two must agree on every target of this vLLM, and on every function of the modules we patch.
"""

from __future__ import annotations

import importlib
import inspect
import types

import pytest
from conftest import PATCHER, vllm_patches

from speculators_hybrid.fingerprint import _function_of, digest, fast_source, fingerprint, resolve

# The shim's targets as applied (originals, stored fingerprints): nothing to compare against a
# patched vLLM source, whose functions differ from the stock ones by design.
pytestmark = pytest.mark.shim_only


# The targets inspect.getsource was slowest on (~640-730 and ~270 lines): one is on every vLLM.
EXAMPLES = {
    "vllm.config.vllm:VllmConfig.__post_init__",
    "vllm.config.speculative:SpeculativeConfig.__post_init__",
}


def _targets():
    """(target, object) for each target of this vLLM: as wrapped by us, and the original."""
    version = PATCHER.version_of("vllm")
    for patch in PATCHER.select(vllm_patches()):
        for target in patch.targets_for(version):
            module = importlib.import_module(target.module)
            found = resolve(module, target.attr)
            assert found is not None, target.name
            yield target, found[2]
            yield target, PATCHER.original(patch, target)


def _by_inspect(obj) -> str:
    """The fingerprint as computed before (and for the constants): `inspect.getsource`."""
    return digest(inspect.getsource(_function_of(obj)))


def test_every_target_fingerprints_as_inspect_does_and_fast(shim):
    seen = set()
    wrapped = 0
    for target, obj in _targets():
        seen.add(target.name)
        if isinstance(obj, dict):  # a lookup table (and our copy of it): read by its entries
            assert fingerprint(obj) in target.fingerprints, target.name
            continue
        if isinstance(obj, type):  # a class a patch replaces: inspect reads it, by name
            assert fingerprint(obj) == _by_inspect(obj), target.name
            continue
        wrapped += hasattr(_function_of(obj), "__wrapped__")
        source = fast_source(_function_of(obj))
        assert source is not None, f"{target.name}: not read from its code object"
        assert source == inspect.getsource(_function_of(obj)), target.name
        assert fingerprint(obj) == _by_inspect(obj), target.name
        assert fingerprint(obj) in target.fingerprints, target.name
    assert EXAMPLES & seen, f"neither long __post_init__ is a target here: {seen}"
    assert wrapped, "no target is wrapped by us: the wrapt case went untested"


def _functions(module: types.ModuleType):
    """Every function defined in `module`, at top level or in its classes (raw attributes)."""
    for name, value in vars(module).items():
        if isinstance(value, types.FunctionType) and value.__module__ == module.__name__:
            yield name, value
        elif isinstance(value, type) and value.__module__ == module.__name__:
            for attr, raw in vars(value).items():
                if isinstance(raw, property):
                    raw = raw.fget
                if isinstance(_function_of(raw), types.FunctionType):
                    yield f"{name}.{attr}", raw


def test_every_function_of_the_patched_modules_reads_as_inspect_does(shim):
    modules = {target.module for target, _ in _targets()}
    fast = slow = 0
    for module_name in sorted(modules):
        for name, raw in _functions(importlib.import_module(module_name)):
            func = _function_of(raw)
            try:
                expected = inspect.getsource(func)
            except (OSError, TypeError):
                continue
            got = fast_source(func)
            if got is None:
                slow += 1
                continue
            fast += 1
            assert got == expected, f"{module_name}:{name}"
            assert fingerprint(raw) == digest(expected), f"{module_name}:{name}"
    assert fast > 10 * max(slow, 1), (fast, slow)  # the fallback is for odd cases only
