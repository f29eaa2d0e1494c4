"""Arms the speculators patches in every Python process started under `speculators-hybrid run`.

Python imports the first `sitecustomize` on `sys.path` at start-up (unless run with `-S`,
`-I` or `-E`); `run` puts this directory first on `PYTHONPATH`, which every child process
inherits (torchrun workers, DataLoader workers, `subprocess`). This module only adds a
stdlib meta path finder, then runs the `sitecustomize` it shadows, if any. When the process
first looks up `speculators`, the finder applies `speculators_hybrid.speculators_patches`
(which hook the speculators modules they patch) and steps aside; processes that never import
speculators import nothing of ours. A Python that cannot import speculators_hybrid (another
virtualenv) prints a warning instead, since it then trains without the patches.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))


class _ArmOnSpeculators:
    """Meta path finder that arms the patches on the first lookup of `speculators`."""

    done = False

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name != "speculators" or self.done:
            return None
        self.done = True  # stays in sys.meta_path, inert: no list surgery mid-import
        try:
            from speculators_hybrid.speculators_patches import arm
        except ImportError as exc:
            print(
                f"speculators-hybrid: {sys.executable} cannot import speculators_hybrid "
                f"({exc}); speculators runs WITHOUT its patches in pid {os.getpid()}",
                file=sys.stderr,
            )
            return None
        arm()
        return None  # the real finders import speculators


def _chain() -> None:
    """Run the next `sitecustomize` on sys.path, the one Python would have run without us."""
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


try:
    if not any(isinstance(f, _ArmOnSpeculators) for f in sys.meta_path):
        sys.meta_path.insert(0, _ArmOnSpeculators())
finally:
    _chain()
