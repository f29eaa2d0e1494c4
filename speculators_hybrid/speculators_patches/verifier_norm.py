"""The frozen verifier norm applies `x * (1 + w)` for Qwen3.5 / Qwen3.6 / Qwen3-Next verifiers.

Why: speculators rebuilds the verifier's output distribution from the last hidden state
(`verifier_norm` then `verifier_lm_head`) to get the training targets. Its `verifier_norm` is
a plain RMSNorm (`x * w`: `LlamaRMSNorm` / `Qwen3RMSNorm`), but the final norm of `qwen3_5`,
`qwen3_5_text`, `qwen3_5_moe`, `qwen3_5_moe_text` and `qwen3_next` models is `x * (1 + w)`
with zero-centred weights, so every target is mis-scaled and the drafter learns from wrong
distributions, silently. speculators 0.9.0 picks `Gemma3RMSNorm` for `qwen3_5` and
`qwen3_5_text` in the DFlash family only (`models.utils.resolve_verifier_norm_class`); EAGLE-3
(and P-EAGLE, which inherits it) and the MoE / Next types stay wrong.
How: after `Eagle3DraftModel.__init__` / `DFlashDraftModel.__init__` (which also run for
P-EAGLE, DSpark, DFlash2 and XPress), if the verifier's model type (its config, `text_config`
first, else its `architectures`) is one of those, `verifier_norm` becomes a norm computing
`x / rms(x) * (1 + w)` exactly like transformers' own class, before the verifier weights
are loaded into it. Other verifiers, and norms that already apply `1 + w`, are left alone.
Upstream: none yet for these types (speculators 0.9.0 covers qwen3_5 / qwen3_5_text in
DFlash only). The version ranges are open: a later speculators whose code differs makes the
patch fail closed until it is checked again.
"""

from __future__ import annotations

import logging
from functools import cache
from typing import Any

from speculators_hybrid.registry import Patch, Target
from speculators_hybrid.speculators_patches import _targets

logger = logging.getLogger("speculators_hybrid")

ONE_PLUS_W_MODEL_TYPES = frozenset(
    ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_next")
)
_ARCHITECTURES = {
    "Qwen3_5ForConditionalGeneration": "qwen3_5",
    "Qwen3_5ForCausalLM": "qwen3_5_text",
    "Qwen3_5MoeForConditionalGeneration": "qwen3_5_moe",
    "Qwen3_5MoeForCausalLM": "qwen3_5_moe_text",
    "Qwen3NextForCausalLM": "qwen3_next",
}
# Norm classes that already compute `1 + w` (speculators 0.9.0 uses Gemma3RMSNorm).
_ONE_PLUS_W_NORMS = frozenset(
    {
        "OnePlusWeightRMSNorm",
        "Gemma3RMSNorm",
        "Qwen3_5RMSNorm",
        "Qwen3_5MoeRMSNorm",
        "Qwen3NextRMSNorm",
    }
)


@cache
def _config_model_type(name_or_path: str) -> str | None:
    """The model type of a verifier config (its `text_config` first), read as a plain dict."""
    try:
        from transformers import PretrainedConfig

        config, _ = PretrainedConfig.get_config_dict(name_or_path)
    except Exception:  # noqa: BLE001 (offline, no such path, bad json: fall back)
        return None
    text = config.get("text_config")
    if isinstance(text, dict) and text.get("model_type"):
        return str(text["model_type"]).lower()
    return str(config.get("model_type") or "").lower() or None


def verifier_model_type(config: Any) -> str | None:
    verifier = getattr(getattr(config, "speculators_config", None), "verifier", None)
    if verifier is None:
        return None
    name = getattr(verifier, "name_or_path", None)
    found = _config_model_type(str(name)) if name else None
    if found:
        return found
    for arch in getattr(verifier, "architectures", None) or ():
        if arch in _ARCHITECTURES:
            return _ARCHITECTURES[arch]
    return None


def use_one_plus_w_norm(model: Any) -> bool:
    """Give `model` a `1 + w` verifier norm if its verifier needs one; True if replaced."""
    norm = getattr(model, "verifier_norm", None)
    if norm is None or type(norm).__name__ in _ONE_PLUS_W_NORMS:
        return False
    model_type = verifier_model_type(getattr(model, "config", None))
    if model_type not in ONE_PLUS_W_MODEL_TYPES:
        return False
    from speculators_hybrid.speculators_patches.norm import frozen_verifier_norm

    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6))
    model.verifier_norm = frozen_verifier_norm(norm.weight.shape[0], eps, norm.weight)
    logger.info(
        "speculators-hybrid: %s verifier_norm for a %s verifier computes x * (1 + w) (was %s)",
        type(model).__name__,
        model_type,
        type(norm).__name__,
    )
    return True


def _after_init(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    result = wrapped(*args, **kwargs)
    use_one_plus_w_norm(instance)
    return result


_FIXED_UPSTREAM = (
    "none yet; speculators 0.9.0 fixes qwen3_5 / qwen3_5_text in the DFlash family only "
    "(models.utils.resolve_verifier_norm_class)"
)

EAGLE3 = Patch(
    id="verifier-norm-eagle3",
    project="speculators",
    versions=">=0.5.0",
    fixed_upstream=_FIXED_UPSTREAM,
    why=__doc__ or "",
    targets=(
        Target(
            module=_targets.EAGLE3_MODULE,
            attr=_targets.EAGLE3_INIT,
            wrapper=_after_init,
            fingerprints=_targets.EAGLE3_INIT_PRINTS,
        ),
    ),
)

DFLASH = Patch(
    id="verifier-norm-dflash",
    project="speculators",
    versions=">=0.6.0",  # 0.5.0's DFlash has no verifier norm (hard targets)
    fixed_upstream=_FIXED_UPSTREAM,
    why=__doc__ or "",
    targets=(
        Target(
            module=_targets.DFLASH_MODULE,
            attr=_targets.DFLASH_INIT,
            wrapper=_after_init,
            fingerprints=_targets.DFLASH_INIT_PRINTS,
        ),
    ),
)
