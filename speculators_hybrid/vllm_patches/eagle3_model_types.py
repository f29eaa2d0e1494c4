"""Extraction accepts the hybrid families our EAGLE-3 patches serve (vLLM 0.20-0.21).

Why: vLLM 0.20.0-0.21.x's `SpeculativeConfig._verify_args` refuses `eagle3`,
`extract_hidden_states` and `dflash` for any target whose model type contains none of a fixed
list of names ("extract_hidden_states is only supported for ['llama', 'qwen', ...] models"),
before any model class is looked at. Granite 4.0-H, Falcon-H1, Jamba, LFM2, LFM2-MoE and Zamba2
are not on it, so the EAGLE-3 patches of those families (eagle3_granite.py, ...) could not help
there. vLLM 0.22 dropped the list (the model class decides, as check-extraction-input checks).
How: `_verify_args` runs as it is; when it raises that refusal for `extract_hidden_states` and
one of these model types, the check that follows it in vLLM (the draft's vocabulary) runs and
the config stands. `_verify_args` is a pydantic validator, which pydantic calls through the
function it found when the class was built: that call is pointed once at the class attribute
(`follow_class_attribute`), so replacing and restoring the attribute is what applies and
reverts the patch.
Upstream: vLLM 0.22.0 (the list is gone).
"""

from __future__ import annotations

import sys
from typing import Any

from speculators_hybrid.registry import Patch, Target

MODULE = "vllm.config.speculative"
MODEL_TYPES = ("granitemoehybrid", "falcon_h1", "jamba", "lfm2", "lfm2_moe", "zamba2")
REFUSAL = "is only supported for"


def refused_by_name(config: Any, exc: ValueError) -> bool:
    """`exc` is the list refusal of extraction from one of MODEL_TYPES."""
    target = getattr(config, "target_model_config", None)
    model_type = getattr(getattr(target, "hf_text_config", None), "model_type", None)
    return (
        config.method == "extract_hidden_states"
        and model_type in MODEL_TYPES
        and f"{config.method} {REFUSAL}" in str(exc)
    )


def follow_class_attribute(cls: type, name: str, holders: tuple[str, ...]) -> None:
    """Make pydantic's validator `name` of `cls` call `cls.<name>` as it is at call time, in
    `cls` and in the classes named in `holders` ("module:Class", rebuilt if already made:
    pydantic copies a field's schema, validator included, into the class that holds it)."""
    from pydantic.dataclasses import rebuild_dataclass

    validator = cls.__pydantic_decorators__.model_validators[name]  # type: ignore[attr-defined]
    if getattr(validator.func, "follows_class_attribute", False):
        return

    def call(self: Any) -> Any:
        return getattr(type(self), name)(self)

    call.follows_class_attribute = True  # type: ignore[attr-defined]
    validator.func = call
    rebuild_dataclass(cls, force=True)  # type: ignore[arg-type]
    for holder in holders:
        module, _, attr = holder.partition(":")
        # not imported, or its class not made yet: it will copy the schema rebuilt above
        built = getattr(sys.modules.get(module), attr, None)
        if built is not None:
            rebuild_dataclass(built, force=True)


def accepting(original: Any) -> Any:
    """`SpeculativeConfig._verify_args` that lets MODEL_TYPES through the name list."""
    from vllm.config.speculative import SpeculativeConfig

    def _verify_args(self: Any) -> Any:
        try:
            return original(self)
        except ValueError as exc:
            if not refused_by_name(self, exc):
                raise
        self.verify_equal_vocab_size_if_draft_model()  # what follows the list in vLLM
        return self

    _verify_args.__wrapped__ = original  # type: ignore[attr-defined]
    _verify_args.__qualname__ = original.__qualname__
    follow_class_attribute(SpeculativeConfig, "_verify_args", ("vllm.config.vllm:VllmConfig",))
    return _verify_args


PATCH = Patch(
    id="extraction-model-type-list",
    project="vllm",
    versions=">=0.20,<0.22",
    fixed_upstream="vLLM 0.22.0 (the list is gone)",
    why=__doc__ or "",
    targets=(
        Target(
            MODULE,
            "SpeculativeConfig._verify_args",
            accepting,
            ("542b02af34479101", "2f5850c83d728082"),  # 0.20.0-0.20.2, 0.21.0
            replaces=True,
        ),
    ),
)
