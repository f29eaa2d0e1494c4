"""MTP finetuning feeds the MTP head the state after the verifier's final norm, as vLLM serves it.

Why: vLLM serves a native MTP head (`--speculative-config '{"method": "mtp"}'`; `qwen3_5_mtp`,
`qwen3_next_mtp`) with the target's output hidden state: for MTP the model runner keeps no aux
states (`use_aux_hidden_state_outputs` is False) and hands the proposer what the model's
`forward` returns, after its final norm (`hidden_states, _ = self.norm(hidden_states, residual)`
in `Qwen3NextModel.forward`, also Qwen3.5's; the tensor `compute_logits` scores). The head then
applies its own `pre_fc_norm_hidden`. speculators' MTP finetuning (`--speculator-type mtp`,
0.8.0-0.9.0) trains the same head on `verifier_last_hidden_states`, the files' last layer id
(`num_hidden_layers`): the residual stream before the final norm. The head's RMSNorm hides the
magnitude, not the final norm's per-channel gains `1 + w`: the head is finetuned on one input
and served another, and only acceptance shows it.
How: after `MTPDraftModel.__init__`, for a Qwen3.5 / Qwen3.5-MoE / Qwen3-Next verifier, the model
gets a frozen `verifier_norm` (`x / rms(x) * (1 + w)`, verifier_norm.py's class), which
speculators' own `load_verifier_weights` fills with the verifier's final norm (it loads
`model.norm.weight` into any `verifier_norm`), kept out of saved checkpoints (the stitched
checkpoint is the verifier's, norm included), and a forward pre-hook that passes `hidden_states`
through it: step 0 sees what vLLM serves; later steps take the head's own output, as in vLLM.
Other verifiers are left alone.
Upstream: none yet.
"""

from __future__ import annotations

import logging
from typing import Any

from speculators_hybrid.registry import Patch, Target
from speculators_hybrid.speculators_patches.verifier_norm import (
    ONE_PLUS_W_MODEL_TYPES,
    verifier_model_type,
)

logger = logging.getLogger("speculators_hybrid")

MODULE = "speculators.models.mtp.core"
KEY = "verifier_norm.weight"


def _served_input(module: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Forward pre-hook: `hidden_states` (keyword, or the second positional) normed."""
    if "hidden_states" in kwargs:
        kwargs["hidden_states"] = module.verifier_norm(kwargs["hidden_states"])
    elif len(args) > 1:
        args = (args[0], module.verifier_norm(args[1]), *args[2:])
    return args, kwargs


def add_final_norm(model: Any) -> bool:
    """Give an MTP `model` its verifier's final norm in front of the head; True if added."""
    if hasattr(model, "verifier_norm"):
        return False
    model_type = verifier_model_type(getattr(model, "config", None))
    if model_type not in ONE_PLUS_W_MODEL_TYPES:
        return False
    from speculators_hybrid.speculators_patches.norm import frozen_verifier_norm

    layer = model.config.transformer_layer_config
    like = model.embed_tokens.weight
    model.verifier_norm = frozen_verifier_norm(layer.hidden_size, layer.rms_norm_eps, like)
    model._keys_to_ignore_on_save = {*(model._keys_to_ignore_on_save or ()), KEY}
    model.register_forward_pre_hook(_served_input, with_kwargs=True)
    logger.info(
        "speculators-hybrid: MTPDraftModel for a %s verifier trains on the final norm's output, "
        "as vLLM serves the head",
        model_type,
    )
    return True


def _after_init(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    result = wrapped(*args, **kwargs)
    add_final_norm(instance)
    return result


PATCH = Patch(
    id="mtp-final-norm",
    project="speculators",
    versions=">=0.8.0",
    fixed_upstream="none yet (speculators 0.8.0-0.9.0 train the head on the pre-norm state)",
    why=__doc__ or "",
    targets=(
        Target(
            module=MODULE,
            attr="MTPDraftModel.__init__",
            wrapper=_after_init,
            fingerprints=("90db4b7ff43ca8c2",),  # 0.8.0-0.9.0
        ),
    ),
)
