"""Fingerprints of the upstream code a patch replaces.

A fingerprint is the first 16 hex digits of the SHA-256 of the function's source, dedented,
with blank lines and trailing spaces dropped: stable across Python versions (unlike
bytecode) and across reformatting of unrelated code.
"""

from __future__ import annotations

import hashlib
import inspect
import textwrap
from typing import Any


def _function_of(obj: Any) -> Any:
    if isinstance(obj, (staticmethod, classmethod)):
        return obj.__func__
    return obj


def fingerprint(obj: Any) -> str:
    func = _function_of(obj)
    try:
        source = inspect.getsource(func)
    except (OSError, TypeError) as exc:
        return f"unreadable:{type(exc).__name__}"
    lines = [line.rstrip() for line in textwrap.dedent(source).splitlines()]
    text = "\n".join(line for line in lines if line)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


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
