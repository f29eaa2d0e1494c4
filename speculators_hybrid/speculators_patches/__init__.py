"""Runtime patches for speculators (training side), one module per patched area.

They use the same framework as the vLLM patches (`registry.Patcher`), with a `Patcher` of
their own gated on the installed speculators version. Nothing here runs by itself:
`speculators-hybrid run` puts `speculators_hybrid/bootstrap` on `PYTHONPATH`, whose
`sitecustomize` calls `arm()` in a process when it first imports speculators; processes
that never import speculators are left alone. `SPECULATORS_HYBRID_DISABLE=1` turns it off.
"""

from __future__ import annotations

import logging
import os
import sys

from speculators_hybrid.registry import Patch, Patcher
from speculators_hybrid.speculators_patches import (
    draft_config_norm_eps,
    mtp_final_norm,
    verifier_logit_scale,
    verifier_norm,
)
from speculators_hybrid.switches import disabled
from speculators_hybrid.versions import installed

PATCHES: tuple[Patch, ...] = (
    verifier_norm.EAGLE3,
    verifier_norm.DFLASH,
    verifier_logit_scale.PATCH,
    draft_config_norm_eps.PATCH,
    mtp_final_norm.PATCH,
)

PATCHER = Patcher(version_of=installed)

logger = logging.getLogger("speculators_hybrid")


def _log_to_stderr() -> None:
    """Our lines reach stderr even when the training script configures no logging."""
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


def arm() -> bool:
    """Apply the patches this speculators needs; each takes effect when its module is
    imported (at once if already imported). False if switched off. Raises `PatchError`
    (fail closed) if a patched module is already imported and its code changed."""
    if disabled():
        return False
    _log_to_stderr()
    selected = PATCHER.apply(PATCHES)
    logger.info(
        "speculators-hybrid: pid=%d speculators=%s patches=%s",
        os.getpid(),
        installed("speculators"),
        ",".join(p.id for p in selected) or "none",
    )
    return True
