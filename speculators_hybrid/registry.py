"""The patch framework: declare, select by version, verify, apply, revert.

A `Patch` names its targets (module + attribute), the project versions that need it,
the upstream change that fixes it, and a fingerprint of every target it replaces.
Applying is lazy: a post-import hook fires when a target module is imported (or at once
if it already is), so import order does not matter. It fails closed: if any target of
the selected set is missing or changed, every target this process already patched is
restored and `PatchError` says which function, which version and what to do. A strict
`Patcher` raises it; the plugin's records it and stays inert (speculators_hybrid.guard).

`PATCHER` is the process-wide `Patcher` of vLLM's patches, which the plugin applies; lower
layers (guard, provenance metadata, planning) ask `patcher()` for it, never the plugin.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import wrapt
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from speculators_hybrid import switches
from speculators_hybrid.fingerprint import fingerprint, resolve
from speculators_hybrid.versions import installed

logger = logging.getLogger("vllm.speculators_hybrid")

# wrapt-style wrapper: (wrapped, instance, args, kwargs) -> result
Wrapper = Callable[[Any, Any, tuple, dict], Any]


def argument(args: tuple, kwargs: dict, index: int, name: str) -> Any:
    """A wrapped call's argument, passed by position or by name."""
    return args[index] if len(args) > index else kwargs[name]


def state_on(obj: Any, name: str, make: Callable[[], Any]) -> Any:
    """A patch's own state kept on a patched object (made on first use): `obj.<name>`."""
    if not hasattr(obj, name):
        setattr(obj, name, make())
    return getattr(obj, name)


class PatchError(RuntimeError):
    """A target of a selected patch is missing or is not the code the patch was written for."""

    def __init__(self, message: str, patch: str = "", target: str = "", version: str = ""):
        super().__init__(message)
        self.patch, self.target, self.version = patch, target, version

    def short(self) -> str:
        """One clause: which patch's target changed."""
        return f"{self.target} is not what patch {self.patch} was written for"


@dataclass(frozen=True)
class Target:
    module: str
    attr: str  # "name" or "Class.name"
    wrapper: Wrapper | Callable[[Any], Any]  # a factory of the replacement when `replaces`
    # Accepted fingerprints of the original code, one per distinct upstream version.
    fingerprints: tuple[str, ...]
    # Narrower than the patch's range where the code moved between releases.
    versions: str | None = None
    # Set in place of the original instead of wrapping it: `wrapper` is then called once with
    # the original and returns the plain object to install (a method vLLM compiles through its
    # class's `forward.__code__`, which a wrapt proxy would hand over as the original's code;
    # a class replaced by a subclass). Revert restores the original as for a wrapper.
    replaces: bool = False

    @property
    def name(self) -> str:
        return f"{self.module}:{self.attr}"

    def applies_to(self, version: str | None) -> bool:
        return self.versions is None or (
            version is not None and base_version(version) in SpecifierSet(self.versions)
        )


@dataclass(frozen=True)
class Patch:
    id: str
    project: str  # distribution whose version gates the patch, e.g. "vllm"
    versions: str  # PEP 440 specifier of the versions that need it
    fixed_upstream: str  # the change that fixes it upstream and where it ships, or "none yet"
    why: str
    targets: tuple[Target, ...]

    def needed_for(self, version: str | None) -> bool:
        if version is None:
            return False
        return base_version(version) in SpecifierSet(self.versions)

    def targets_for(self, version: str | None) -> tuple[Target, ...]:
        return tuple(t for t in self.targets if t.applies_to(version))


def base_version(version: str) -> Version:
    """`0.20.1+cu130` and `0.21.1.dev3` are gated as their release, `0.20.1` / `0.21.1`."""
    try:
        return Version(Version(version).base_version)
    except InvalidVersion as exc:
        raise PatchError(f"cannot read version {version!r}: {exc}") from exc


@dataclass
class _Applied:
    owner: Any
    name: str
    original: Any


@dataclass
class Patcher:
    """Applies one set of patches in this process. `PATCHER` is the process-wide one."""

    version_of: Callable[[str], str | None]
    strict: bool = True  # raise PatchError on a changed target; else record it in `failed`
    selected: list[Patch] = field(default_factory=list)
    active: bool = False
    failed: PatchError | None = None
    # (patch id, target name) -> what it replaced; two patches may wrap one target, in order.
    _applied: dict[tuple[str, str], _Applied] = field(default_factory=dict)
    _hooked: set[str] = field(default_factory=set)
    _lock: threading.RLock = field(default_factory=threading.RLock)

    def select(self, patches: Iterable[Patch]) -> list[Patch]:
        """The patches the installed versions need, less those SPECULATORS_HYBRID_DISABLED_PATCHES
        turns off."""
        off = switches.disabled_patches()
        return [p for p in patches if p.id not in off and p.needed_for(self.version_of(p.project))]

    def apply(self, patches: Iterable[Patch]) -> list[Patch]:
        """Arm the patches this install needs. Idempotent; returns the selected ones."""
        with self._lock:
            if self.active:
                return self.selected
            if self.failed is not None:
                raise self.failed
            self.selected = self.select(patches)
            self.active = True
            for module in sorted({t.module for p in self.selected for t in self._targets(p)}):
                if module not in self._hooked:
                    self._hooked.add(module)  # fires now if already imported
                    wrapt.register_post_import_hook(self._on_import, module)
                elif module in sys.modules:  # hooked before, then reverted
                    self._on_import(sys.modules[module])
            return self.selected

    def revert(self) -> None:
        """Restore every original. The hooks stay registered but do nothing until `apply`."""
        with self._lock:
            for applied in reversed(list(self._applied.values())):
                setattr(applied.owner, applied.name, applied.original)
            self._applied.clear()
            self.active = False
            self.selected = []
            self.failed = None

    def verify_all(self) -> PatchError | None:
        """Import every target module of the selected set now (each is verified as it comes
        in); the failure, if any. Where patches must hold before they are used."""
        import importlib

        with self._lock:
            targets = {t.module: p for p in self.selected for t in self._targets(p)}
        for module, patch in sorted(targets.items()):
            if self.failed is not None:
                break
            try:
                importlib.import_module(module)
            except PatchError:
                pass  # recorded in `failed` by the hook
            except ImportError as exc:
                version = f"{patch.project} {self.version_of(patch.project)}"
                with self._lock:
                    self.revert()
                    self.failed = PatchError(
                        f"speculators-hybrid patch {patch.id!r}: module {module} cannot be "
                        f"imported in {version} ({exc}); nothing was patched.",
                        patch.id,
                        module,
                        version,
                    )
        return self.failed

    def applied(self) -> list[str]:
        """Ids of the patches whose every target is patched in this process."""
        with self._lock:
            return [
                p.id
                for p in self.selected
                if all((p.id, t.name) in self._applied for t in self._targets(p))
            ]

    def _targets(self, patch: Patch) -> tuple[Target, ...]:
        return patch.targets_for(self.version_of(patch.project))

    def original(self, patch: Patch, target: Target) -> Any:
        with self._lock:
            return self._applied[(patch.id, target.name)].original

    def verify(self, patch: Patch, target: Target, module: Any) -> Any:
        """Return the object `target` replaces, or raise `PatchError` naming what changed."""
        version = self.version_of(patch.project)
        found = resolve(module, target.attr)
        if found is None:
            raise PatchError(
                f"speculators-hybrid patch {patch.id!r}: {target.name} does not exist in "
                f"{patch.project} {version}. The patch was written for {patch.project} "
                f"{patch.versions}; nothing was patched. Install a {patch.project} version "
                "from that range, upgrade speculators-hybrid, or set SPECULATORS_HYBRID_DISABLE=1 "
                "to run without it.",
                patch.id,
                target.name,
                f"{patch.project} {version}",
            )
        owner, name, original = found
        got = fingerprint(original)
        if got not in target.fingerprints:
            raise PatchError(
                f"speculators-hybrid patch {patch.id!r}: {target.name} in {patch.project} "
                f"{version} is not the code the patch replaces (fingerprint {got}, expected one "
                f"of {', '.join(target.fingerprints)}). Nothing was patched. Your {patch.project} "
                "may be a fork or a patched build: install a released version, upgrade "
                "speculators-hybrid, or set SPECULATORS_HYBRID_DISABLE=1 to run without it.",
                patch.id,
                target.name,
                f"{patch.project} {version}",
            )
        return owner, name, original

    def _on_import(self, module: Any) -> None:
        with self._lock:
            if not self.active:
                return
            todo = [
                (p, t)
                for p in self.selected
                for t in self._targets(p)
                if t.module == module.__name__ and (p.id, t.name) not in self._applied
            ]
            try:
                # Verify everything before changing anything; a target wrapped by an earlier
                # patch still fingerprints as the upstream code (inspect unwraps wrapt proxies).
                for p, t in todo:
                    self.verify(p, t, module)
            except PatchError as exc:
                self.revert()
                self.failed = exc
                logger.error("%s", exc)
                if self.strict:
                    raise
                return
            for p, t in todo:
                owner, name, original = resolve(module, t.attr)  # type: ignore[misc]
                if t.replaces:
                    new = t.wrapper(original)  # type: ignore[call-arg]
                else:
                    new = _wrap(original, t.wrapper)  # type: ignore[arg-type]
                setattr(owner, name, new)
                self._applied[(p.id, t.name)] = _Applied(owner, name, original)


def _wrap(original: Any, wrapper: Wrapper) -> Any:
    if isinstance(original, staticmethod):
        return staticmethod(wrapt.FunctionWrapper(original.__func__, wrapper))
    if isinstance(original, classmethod):
        return classmethod(wrapt.FunctionWrapper(original.__func__, wrapper))
    return wrapt.FunctionWrapper(original, wrapper)


# not strict: a changed target leaves vLLM unpatched and `guard` refuses hybrid extraction;
# everything else runs as without the plugin. Tests may replace it.
PATCHER = Patcher(version_of=installed, strict=False)


def patcher() -> Patcher:
    """The process-wide vLLM `PATCHER` (looked up at each call, so a replaced one is seen)."""
    return PATCHER
