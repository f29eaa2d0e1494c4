"""`fingerprint` reads a function's source from its code object; the text must be exactly what
`inspect.getsource` gives (the patches' constants were computed from it), for every shape of
target, and where that cannot be told from the code object `inspect` must decide."""

from __future__ import annotations

import importlib
import inspect
import sys

import pytest
import wrapt

from speculators_hybrid.fingerprint import _function_of, digest, fast_source, fingerprint

SOURCE = '''\
import functools


def deco(func):
    @functools.wraps(func)
    def inner(*args, **kwargs):
        return func(*args, **kwargs)

    return inner


def tagged(*names, **options):
    return lambda func: func


def plain(x):
    y = x + 1

    return y  # a comment on the last line
# a comment at the margin, then code
VALUE = 1


class Box:
    @functools.cached_property
    def cached(self):
        return 1

    @property
    def size(self):
        return (
            1,
            2,
        )

    @classmethod
    def make(cls):
        return cls()

    @staticmethod
    def helper(
        a,
        b,
    ):
        return {
            "a": a,
            "b": b,
        }

    @deco
    def decorated(self, x):
        return x

    @tagged(
        "one",
        two=2,
    )
    def tagged_over_lines(self):
        return 2

    def nested_last(self):
        def inner():
            return [
                i
                for i in range(3)
            ]
        return inner

    def docstring_only(self):
        """Nothing else.

        Two paragraphs.
        """

    @deco
    def decorated_docstring_only(self):
        """Nothing else."""

    def signature_over_lines(
        self,
        a,
    ) -> None:
        """Nothing else."""

    def trailing_comment(self):
        x = 1
        return x
        # still the body's, for inspect

    def trailing_pass(self):
        try:
            self.size
        except AttributeError:
            pass

    def trailing_string(self):
        self.size
        """a string as the last statement"""

    def one_line(self): return 3

    def last(self):
        return 4


short = lambda x: (
    x + 1
)
'''

# attribute -> whether the code object tells the source (else `inspect` decides); None: the
# compiler may or may not leave an instruction on the last line (same text either way)
CASES = {
    "plain": True,
    "Box.cached": True,
    "Box.size": True,
    "Box.make": True,
    "Box.helper": True,
    "Box.decorated": True,
    "Box.tagged_over_lines": True,
    "Box.nested_last": True,
    "Box.docstring_only": False,
    "Box.decorated_docstring_only": False,
    "Box.signature_over_lines": False,
    "Box.trailing_comment": False,
    "Box.trailing_pass": None,
    "Box.trailing_string": None,
    "Box.one_line": True,
    "Box.last": True,
    "short": False,
}


@pytest.fixture
def shapes(tmp_path, monkeypatch):
    (tmp_path / "fp_shapes.py").write_text(SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield importlib.import_module("fp_shapes")
    sys.modules.pop("fp_shapes", None)


def _raw(module, attr: str):
    owner = module
    *path, name = attr.split(".")
    for part in path:
        owner = getattr(owner, part)
    raw = vars(owner)[name] if isinstance(owner, type) else getattr(owner, name)
    if isinstance(raw, property):
        return raw.fget
    if hasattr(raw, "func") and not callable(raw):  # cached_property
        return raw.func
    return raw


@pytest.mark.parametrize(("attr", "fast"), CASES.items())
def test_source_is_inspects(shapes, attr, fast):
    raw = _raw(shapes, attr)
    func = _function_of(raw)
    expected = inspect.getsource(func)
    got = fast_source(func)
    if fast is not None:
        assert (got is not None) is fast, got
    if got is not None:
        assert got == expected
    assert fingerprint(raw) == digest(expected)
    wrapped = wrapt.FunctionWrapper(func, lambda w, i, a, k: w(*a, **k))
    assert fingerprint(wrapped) == digest(expected)  # a target we (or another patch) wrapped
    if isinstance(raw, staticmethod | classmethod):
        assert fingerprint(type(raw)(wrapped)) == digest(expected)


def test_what_inspect_cannot_read_is_unreadable_as_before(shapes):
    prop = vars(shapes.Box)["size"]
    with pytest.raises(TypeError):
        inspect.getsource(prop)
    assert fingerprint(prop) == "unreadable:TypeError"
    assert fingerprint(len) == "unreadable:TypeError"


def test_fingerprint_follows_the_file(shapes):
    assert fingerprint(shapes.plain) != fingerprint(shapes.Box.last)
    assert fingerprint(vars(shapes.Box)["make"]) == fingerprint(shapes.Box.make.__func__)


def test_a_table_of_classes_fingerprints_by_its_keys_and_their_names(shapes):
    table = {"plain": shapes.plain, "box": shapes.Box}
    expected = digest("box=Box\nplain=plain")
    assert fingerprint(table) == expected
    assert fingerprint(dict(reversed(table.items()))) == expected  # order does not count
    assert fingerprint(table | {"last": shapes.Box.last}) != expected  # a new entry does
    assert fingerprint({"plain": shapes.Box, "box": shapes.plain}) != expected  # so does a swap

    class Replacement(dict):
        pass

    replacement = Replacement(table, extra=shapes.plain)
    assert fingerprint(replacement) == "unreadable:TypeError"  # not a plain dict
    replacement.__wrapped__ = table  # type: ignore[attr-defined]
    assert fingerprint(replacement) == expected  # a patch's copy reads as the original
    assert fingerprint({"one": 1}) == "unreadable:TypeError"  # values that name nothing
