"""The default draft config builds for Nemotron-H and LFM2 verifiers (their own norm eps).

(LFM2 here means `lfm2` and `lfm2_moe`: both name the eps `norm_eps`.)

Why: without `--draft-config`, `speculators train` builds the drafter's decoder config with
`speculators.train.cli.create_transformer_layer_config`, which copies `rms_norm_eps` from the
verifier's config (it becomes the eps of the frozen verifier norm, too) and, when no
`--draft-hidden-act` is given, `hidden_act`. Nemotron-H configs (`nemotron_h`) name the eps
`layer_norm_epsilon` and LFM2 configs (`lfm2`, `lfm2_moe`) name it `norm_eps`, and neither has a
`hidden_act`, so the builder raises AttributeError and users must hand-write a `--draft-config`,
where nothing checks that its eps is the verifier's (a wrong one is silent).
How: around `create_transformer_layer_config` (speculators 0.8.0+; 0.7.0 builds the config in
scripts/train.py, outside the wheel), the `AutoConfig` the builder loads the verifier's config
with hands back, for a `nemotron_h` / `lfm2` text config, the same config with `rms_norm_eps`
set to the family's own eps field where it has none, and `hidden_act` "silu" (the CLI's default
draft activation) where it has neither `hidden_act` nor `hidden_activation`. Nothing else
changes: other verifiers, fields a config does set, and `--draft-config` are untouched; the
name is rebound only for the call, under a lock.
Upstream: none yet (speculators 0.8.0 to 0.9.0 read `rms_norm_eps` only). The version range is
open: a later speculators whose builder differs makes the patch fail closed until it is checked
again; remove the patch once the builder reads these families' eps itself.
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import Any

from speculators_hybrid.registry import Patch, Target

logger = logging.getLogger("speculators_hybrid")

# model_type -> the config field holding the eps of its final RMSNorm
EPS_FIELDS = {"nemotron_h": "layer_norm_epsilon", "lfm2": "norm_eps", "lfm2_moe": "norm_eps"}
DEFAULT_HIDDEN_ACT = "silu"  # `speculators train --draft-hidden-act`'s default

_LOCK = threading.RLock()


def expose_draft_fields(config: Any) -> list[str]:
    """Give a Nemotron-H / LFM2 verifier config (its `text_config` if it has one, as the
    builder reads it) `rms_norm_eps` and, where missing, `hidden_act`; the fields set."""
    target = config.text_config if hasattr(config, "text_config") else config
    if target is None:
        return []
    field = EPS_FIELDS.get(str(getattr(target, "model_type", "") or "").lower())
    if field is None:
        return []
    given = []
    eps = getattr(target, field, None)
    if getattr(target, "rms_norm_eps", None) is None and eps is not None:
        target.rms_norm_eps = float(eps)
        given.append(f"rms_norm_eps={target.rms_norm_eps!r} (from {field})")
    if getattr(target, "hidden_act", None) is None and not getattr(
        target, "hidden_activation", None
    ):
        target.hidden_act = DEFAULT_HIDDEN_ACT
        given.append(f"hidden_act={DEFAULT_HIDDEN_ACT!r}")
    return given


class _FamilyFieldsAutoConfig:
    """`AutoConfig` as the builder sees it during the call: `from_pretrained` also runs
    `expose_draft_fields`; everything else is the real class's."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def from_pretrained(self, *args: Any, **kwargs: Any) -> Any:
        config = self._real.from_pretrained(*args, **kwargs)
        given = expose_draft_fields(config)
        if given:
            logger.info(
                "speculators-hybrid: draft config for a %s verifier: %s",
                getattr(getattr(config, "text_config", None) or config, "model_type", "?"),
                ", ".join(given),
            )
        return config

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def _around_builder(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    module = sys.modules[wrapped.__module__]
    with _LOCK:
        real = vars(module).get("AutoConfig")
        if real is None or isinstance(real, _FamilyFieldsAutoConfig):
            return wrapped(*args, **kwargs)  # nothing to wrap, or a nested call
        setattr(module, "AutoConfig", _FamilyFieldsAutoConfig(real))  # noqa: B010
        try:
            return wrapped(*args, **kwargs)
        finally:
            setattr(module, "AutoConfig", real)  # noqa: B010


PATCH = Patch(
    id="draft-config-norm-eps",
    project="speculators",
    versions=">=0.8.0",  # 0.7.0 builds the draft config in scripts/train.py, not the wheel
    fixed_upstream="none yet (speculators 0.8.0-0.9.0 read rms_norm_eps only)",
    why=__doc__ or "",
    targets=(
        Target(
            module="speculators.train.cli",
            attr="create_transformer_layer_config",
            wrapper=_around_builder,
            # 0.8.0-0.8.1, 0.9.0
            fingerprints=("42e271b6888ccd37", "12005d5a7fed0413"),
        ),
    ),
)
