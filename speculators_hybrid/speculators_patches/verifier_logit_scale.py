"""The frozen verifier lm_head applies the verifier's logit scale (Granite, Falcon-H1).

Why: speculators rebuilds the verifier's output distribution from the last hidden state as
`verifier_lm_head(verifier_norm(h))` to get the training targets. Granite models (model types
`granite*`: Granite 3.x, GraniteMoE, Granite 4.0-H `granitemoehybrid`, Granite 4 Vision's text
model) divide their logits by `config.logits_scaling` after the lm_head, and Falcon-H1
(`falcon_h1`) multiplies them by `config.lm_head_multiplier`, in transformers and in vLLM.
speculators leaves the scale out, so every target is the model's logits times 6 (Granite 4.0-H,
`logits_scaling` 6) or times 25.6 (Falcon-H1-0.5B, `lm_head_multiplier` 0.0390625): the drafter
learns a far sharper distribution than the model's, silently (same argmax, so greedy acceptance
hides it; sampled acceptance does not).
How: after `Eagle3DraftModel.__init__` / `DFlashDraftModel.__init__` (which also run for
P-EAGLE, DSpark, DFlash2 and XPress), the verifier's config is read as a plain dict, its
`text_config` first (the text model is what scales, as in vLLM, whose composite models hand
the logits to their text model). For a `granite*` text model whose `logits_scaling` is not 1,
or a `falcon_h1` one whose `lm_head_multiplier` is not 1, `verifier_lm_head` becomes a
`heads.ScaledLogitsHead` holding the same weight parameter (same state-dict key, loaded as
before) that computes the matmul, then `/ logits_scaling` or `* lm_head_multiplier`, as
transformers does: its logits equal transformers' bit for bit. Only the targets change; the
drafter's own `lm_head`, its loss and its checkpoint are as before. Other verifiers, scales of
exactly 1 and heads already scaled are left alone.
Upstream: none yet (speculators 0.5.0 to 0.9.0 leave the scale out). The version ranges are
open: a later speculators whose code differs makes the patch fail closed until it is checked
again; remove the patch once speculators applies the verifier's logit scale itself.
"""

from __future__ import annotations

import logging
import math
from functools import cache
from typing import Any

from speculators_hybrid.registry import Patch, Target
from speculators_hybrid.speculators_patches import _targets

logger = logging.getLogger("speculators_hybrid")

GRANITE_PREFIX = "granite"  # every transformers `granite*` text model divides by logits_scaling
FALCON_H1 = "falcon_h1"


@cache
def _config_dict(name_or_path: str) -> dict | None:
    try:
        from transformers import PretrainedConfig

        config, _ = PretrainedConfig.get_config_dict(name_or_path)
    except Exception:  # noqa: BLE001 (offline, no such path, bad json: nothing to scale by)
        return None
    return config if isinstance(config, dict) else None


def logit_scale(config: dict) -> tuple[str, str, float] | None:
    """(model type, "divide" or "multiply", factor) for a verifier config dict, or None.

    The text model decides: `text_config` where the config has one, else the config itself.
    A field the config does not set is transformers' default, 1 (no scale).
    """
    text = config.get("text_config")
    source = text if isinstance(text, dict) else config
    model_type = str(source.get("model_type") or config.get("model_type") or "").lower()
    if model_type.startswith(GRANITE_PREFIX):
        op, field = "divide", "logits_scaling"
    elif model_type == FALCON_H1:
        op, field = "multiply", "lm_head_multiplier"
    else:
        return None
    value = source.get(field)
    if value is None:
        return None
    factor = float(value)
    if factor == 1.0:
        return None
    if not math.isfinite(factor) or factor == 0.0:
        logger.warning(
            "speculators-hybrid: %s verifier has %s=%r; its lm_head is left unscaled",
            model_type,
            field,
            value,
        )
        return None
    return model_type, op, factor


def verifier_logit_scale(config: Any) -> tuple[str, str, float] | None:
    """The logit scale of a speculators model config's verifier, or None."""
    verifier = getattr(getattr(config, "speculators_config", None), "verifier", None)
    name = getattr(verifier, "name_or_path", None)
    found = _config_dict(str(name)) if name else None
    return logit_scale(found) if found is not None else None


def use_scaled_verifier_head(model: Any) -> bool:
    """Make `model.verifier_lm_head` apply its verifier's logit scale; True if replaced."""
    head = getattr(model, "verifier_lm_head", None)
    if head is None or type(head).__name__ == "ScaledLogitsHead":
        return False
    scale = verifier_logit_scale(getattr(model, "config", None))
    if scale is None:
        return False
    import torch

    if type(head) is not torch.nn.Linear:
        logger.warning(
            "speculators-hybrid: %s verifier_lm_head is a %s, not nn.Linear; left unscaled",
            type(model).__name__,
            type(head).__name__,
        )
        return False
    from speculators_hybrid.speculators_patches.heads import ScaledLogitsHead

    model_type, op, factor = scale
    model.verifier_lm_head = ScaledLogitsHead.wrapping(head, op, factor)  # type: ignore[arg-type]
    logger.info(
        "speculators-hybrid: %s verifier_lm_head for a %s verifier: logits %s by %r, as the model",
        type(model).__name__,
        model_type,
        "divided" if op == "divide" else "multiplied",
        factor,
    )
    return True


def _after_init(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    result = wrapped(*args, **kwargs)
    use_scaled_verifier_head(instance)
    return result


PATCH = Patch(
    id="verifier-logit-scale",
    project="speculators",
    versions=">=0.5.0",
    fixed_upstream="none yet (speculators 0.5.0-0.9.0 leave the verifier's logit scale out)",
    why=__doc__ or "",
    targets=(
        Target(
            module=_targets.EAGLE3_MODULE,
            attr=_targets.EAGLE3_INIT,
            wrapper=_after_init,
            fingerprints=_targets.EAGLE3_INIT_PRINTS,
        ),
        Target(
            module=_targets.DFLASH_MODULE,
            attr=_targets.DFLASH_INIT,
            wrapper=_after_init,
            # 0.5.0's DFlash trains on hard targets (its verifier_lm_head is unused)
            versions=">=0.6.0",
            fingerprints=_targets.DFLASH_INIT_PRINTS,
        ),
    ),
)
