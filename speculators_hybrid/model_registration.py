"""Registration patches: architectures added to vLLM's model registry, nothing wrapped.

vLLM's documented way for a plugin to add an architecture is
`ModelRegistry.register_model(arch, "module:Class")`. A `Registration` is a `Patch` with no
wrapped targets: it is listed with the others (`vllm_patches.PATCHES`), so it is version-gated,
shown by `patches list` and named in the plugin's log line; the process-wide `REGISTRAR` does
the registering. An architecture can also share the per-architecture config hook vLLM already
runs for another one (`MODELS_CONFIG_MAP`, vLLM's table of `verify_and_update_config` classes;
vLLM has no public hook for it). Entries are added when vLLM imports the module that holds the
table (or at once if it is imported), never over an entry vLLM has itself (the fix retires where
upstream ships it), and are removed by `revert`. A table that is missing or lacks the entry we
copy from leaves that entry out, with an error in the log; `applied` lists only complete ones.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import wrapt

from speculators_hybrid.registry import Patch

logger = logging.getLogger("vllm.speculators_hybrid")

MODELS = "vllm.model_executor.models.registry"  # ModelRegistry
CONFIGS = "vllm.model_executor.models.config"  # MODELS_CONFIG_MAP


@dataclass(frozen=True)
class Registration(Patch):
    # (architecture, "module:Class") for ModelRegistry.register_model
    models: tuple[tuple[str, str], ...] = ()
    # (architecture, existing architecture whose config hook it gets)
    configs: tuple[tuple[str, str], ...] = ()


def model_table() -> dict[str, Any]:
    """vLLM's registered architectures (name -> registered model)."""
    from vllm.model_executor.models.registry import ModelRegistry

    return ModelRegistry.models


def config_table() -> dict[str, Any]:
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP

    return MODELS_CONFIG_MAP


def upstream_has(registration: Registration) -> list[str]:
    """The architectures of `registration` that this vLLM registers itself (ours not counted)."""
    ours = REGISTRAR.added_by_us()
    return [arch for arch, _ in registration.models if arch in model_table() and arch not in ours]


def check(registration: Registration) -> str:
    """For `patches list`: what registering would do here, loading each class as vLLM would."""
    import importlib

    upstream = upstream_has(registration)
    if upstream:
        return f"vLLM registers {', '.join(upstream)} itself: not added"
    try:
        for _, path in registration.models:
            module, name = path.split(":")
            getattr(importlib.import_module(module), name)
    except Exception as exc:  # what vLLM would log as "Error in loading model architecture"
        return f"FAILS: {path} cannot be loaded: {type(exc).__name__}: {exc}"
    return "every class loads; vLLM lacks these architectures"


@dataclass
class Registrar:
    selected: list[Registration] = field(default_factory=list)
    active: bool = False
    # (module, architecture) -> what we put there
    _added: dict[tuple[str, str], Any] = field(default_factory=dict)
    _done: set[tuple[str, str, str]] = field(default_factory=set)  # (patch id, module, arch)
    _hooked: set[str] = field(default_factory=set)
    _lock: threading.RLock = field(default_factory=threading.RLock)

    def apply(self, selected: Iterable[Patch]) -> list[Registration]:
        """Arm the registrations among the selected patches. Idempotent."""
        with self._lock:
            if self.active:
                return self.selected
            self.selected = [p for p in selected if isinstance(p, Registration)]
            self.active = True
            for module in (MODELS, CONFIGS):
                if module not in self._hooked:
                    self._hooked.add(module)  # fires now if already imported
                    wrapt.register_post_import_hook(self._on_import, module)
                elif module in sys.modules:
                    self._on_import(sys.modules[module])
            return self.selected

    def revert(self) -> None:
        with self._lock:
            for (module, arch), value in self._added.items():
                table = model_table() if module == MODELS else config_table()
                if table.get(arch) is value:
                    del table[arch]
            self._added.clear()
            self._done.clear()
            self.selected = []
            self.active = False

    def applied(self) -> list[str]:
        """Ids whose every entry is in place (added by us, or already there upstream)."""
        with self._lock:
            return [
                p.id
                for p in self.selected
                if all((p.id, MODELS, a) in self._done for a, _ in p.models)
                and all((p.id, CONFIGS, a) in self._done for a, _ in p.configs)
            ]

    def added_by_us(self) -> set[str]:
        with self._lock:
            return {arch for (_, arch) in self._added}

    def _on_import(self, module: Any) -> None:
        with self._lock:
            if not self.active:
                return
            if module.__name__ == MODELS:
                self._register_models(module)
            elif module.__name__ == CONFIGS:
                self._register_configs(module)

    def _register_models(self, module: Any) -> None:
        registry = getattr(module, "ModelRegistry", None)
        if registry is None or not callable(getattr(registry, "register_model", None)):
            logger.error("speculators-hybrid: %s has no ModelRegistry.register_model", MODELS)
            return
        for patch in self.selected:
            for arch, path in patch.models:
                if arch not in registry.models:
                    registry.register_model(arch, path)
                    self._added[(MODELS, arch)] = registry.models[arch]
                elif (MODELS, arch) not in self._added:
                    logger.info(
                        "speculators-hybrid: vLLM registers %s itself; ours not added", arch
                    )
                self._done.add((patch.id, MODELS, arch))

    def _register_configs(self, module: Any) -> None:
        table = getattr(module, "MODELS_CONFIG_MAP", None)
        for patch in self.selected:
            for arch, source in patch.configs:
                if not isinstance(table, dict) or source not in table:
                    logger.error(
                        "speculators-hybrid %s: %s.MODELS_CONFIG_MAP has no %s entry; %s gets "
                        "no config hook",
                        patch.id,
                        CONFIGS,
                        source,
                        arch,
                    )
                    continue
                if arch not in table:
                    table[arch] = table[source]
                    self._added[(CONFIGS, arch)] = table[arch]
                self._done.add((patch.id, CONFIGS, arch))


REGISTRAR = Registrar()
