"""Fingerprints of the upstream code a patch replaces.

A fingerprint is the first 16 hex digits of the SHA-256 of the function's source, dedented,
with blank lines and trailing spaces dropped: stable across Python versions (unlike
bytecode) and across reformatting of unrelated code.

The source is what `inspect.getsource` returns, but read faster (this runs in every vLLM
process, for every target, as vLLM imports it): `inspect.getsource` tokenizes the function to
find where it ends, several ms for vLLM's long `__post_init__`s. The code object already
knows: its lines run from `co_firstlineno` (the first decorator) to the last line any of its
instructions, or of the functions nested in it, covers (`co_positions`, Python >= 3.11). Those
lines come from `linecache`, as `inspect` reads them. Where what follows that last line could
still belong to the block for `inspect` (a comment indented into the body, a trailing `pass`
or string that compiles to no instruction), or the first line is not a `def`/decorator line,
`inspect.getsource` decides, so the text hashed is always the one it gives.

A plain dict whose values are classes or functions (a lookup table, such as a model's map of
layer types) fingerprints as the digest of its sorted `key=<value's __qualname__>` lines; a
replacement that names it in `__wrapped__` fingerprints as it, as a wrapped function does.
"""

from __future__ import annotations

import hashlib
import inspect
import linecache
import re
import textwrap
import types
from typing import Any

# inspect.findsource's test for the line a function's code starts at
_DEF = re.compile(r"^(\s*def\s)|(\s*async\s+def\s)|(.*(?<!\w)lambda(:|\s))|^(\s*@)")


def _function_of(obj: Any) -> Any:
    if isinstance(obj, (staticmethod, classmethod)):
        return obj.__func__
    return obj


def fingerprint(obj: Any) -> str:
    if isinstance(obj, dict):
        return _table(getattr(obj, "__wrapped__", obj))
    func = _function_of(obj)
    try:
        source = fast_source(func)
        if source is None:
            source = inspect.getsource(func)
    except (OSError, TypeError) as exc:
        return f"unreadable:{type(exc).__name__}"
    return digest(source)


def _table(table: Any) -> str:
    named = (type, types.FunctionType)
    if type(table) is not dict or not all(isinstance(v, named) for v in table.values()):
        return "unreadable:TypeError"  # as inspect.getsource fails on it
    return digest("\n".join(sorted(f"{key}={value.__qualname__}" for key, value in table.items())))


def digest(source: str) -> str:
    lines = [line.rstrip() for line in textwrap.dedent(source).splitlines()]
    text = "\n".join(line for line in lines if line)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def fast_source(obj: Any) -> str | None:
    """`inspect.getsource(obj)` for a plain function, from its code object; None if unsure."""
    try:
        func = inspect.unwrap(obj)  # as inspect.getsource does (wrapt proxies, functools.wraps)
    except ValueError:
        return None
    if not isinstance(func, types.FunctionType) or func.__name__ == "<lambda>":
        return None  # inspect ends a lambda at its line's end
    code = func.__code__
    if not hasattr(code, "co_positions") or not code.co_filename.endswith(".py"):
        return None  # Python 3.10, or no source file
    linecache.checkcache(code.co_filename)
    lines = linecache.getlines(code.co_filename)
    first = code.co_firstlineno - 1
    last = _last_line(code)
    if not 0 <= first < last <= len(lines):
        return None
    head = lines[first]
    if first > 0 and not _DEF.match(head):
        return None  # inspect would search upwards for the def
    indent = _indent(head)
    if indent < 0 or not _past_def(lines, first, last, indent):
        return None  # no instruction after the decorators: a body of docstring or `pass`
    if not _ends_block(lines, last, indent):
        return None
    return "".join(lines[first:last])


def _last_line(code: types.CodeType) -> int:
    """The last line any instruction of `code` or of the code nested in it covers."""
    positions = code.co_positions()  # type: ignore[attr-defined]  # Python >= 3.11
    last = max((end for _, end, _, _ in positions if end is not None), default=0)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            last = max(last, _last_line(const))
    return last


def _indent(line: str) -> int:
    """Columns of leading spaces; -1 for other leading whitespace (tabs count differently)."""
    spaces = len(line) - len(line.lstrip(" "))
    return spaces if not line[spaces:].startswith(("\t", "\f")) else -1


def _past_def(lines: list[str], first: int, last: int, indent: int) -> bool:
    """Whether the `def` line, after any decorators from line `first` on, is before `last`."""
    for line in lines[first:last]:
        if _indent(line) == indent and line.lstrip(" ").startswith(("def ", "async ")):
            return True
    return False


def _ends_block(lines: list[str], last: int, indent: int) -> bool:
    """Whether `inspect`'s block finder would stop at line `last` (1-based) too.

    It would if what follows is blank lines, comments at most as indented as the `def`, then
    the end of the file or a line of code at most as indented as the `def` that does not
    close a bracket.
    """
    for line in lines[last:]:
        text = line.strip()
        if not text:
            continue
        if not 0 <= _indent(line) <= indent:
            return False  # a comment or code that may still belong to the block
        if not text.startswith("#"):
            return not text.startswith((")", "]", "}"))  # else the signature goes on
    return True


def resolve(module: Any, attr: str) -> tuple[Any, str, Any] | None:
    """(owner, name, raw attribute) for "name" or "Class.name" in `module`, or None.

    The raw attribute is read from the owner's `__dict__` so staticmethods and
    classmethods come back undecorated-by-binding and can be restored exactly.
    """
    owner: Any = module
    *path, name = attr.split(".")
    for part in path:
        owner = getattr(owner, part, None)
        if owner is None:
            return None
    if isinstance(owner, type):
        for klass in owner.__mro__:
            if name in vars(klass):
                if klass is not owner:
                    return None  # inherited: the patch expects the class to define it
                return owner, name, vars(klass)[name]
        return None
    if not hasattr(owner, name):
        return None
    return owner, name, getattr(owner, name)
