"""Bad extraction input is refused when vLLM builds its config, with a message saying what to do.

Why: vLLM accepts any `eagle_aux_hidden_state_layer_ids` and any target architecture for
`extract_hidden_states`, then fails late and obscurely: duplicate ids (speculators' default
`[2, n//2, n-3, n]` is `[2, 2, 1, 4]` for a 4-layer model) crash vLLM 0.25.0 in `propose` with
"The expanded size of the tensor (4) must match the existing size (3)" (each layer is collected
once, so fewer states come back than ids), ids above n are never collected, and a model class
without EAGLE-3 auxiliary hidden states raises "Model does not support EAGLE3 interface" only
after its weights are loaded. Users may start `vllm serve` directly, without our launcher.
How: after `SpeculativeConfig.__post_init__` of an `extract_hidden_states` run, the ids must be
distinct integers within [0, n] (n = `num_hidden_layers` of the target's text config) and the
target's vLLM model class must implement `SupportsEagle3`; otherwise a `ValueError` names the
ids, the class and the vLLM version. The launcher (`speculators-hybrid launch`) uses the same
id check before it execs vLLM.
Upstream: none yet.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from speculators_hybrid.registry import Patch, Target
from speculators_hybrid.versions import installed

logger = logging.getLogger("vllm.speculators_hybrid")

IDS_FIELD = "speculative_config.draft_model_config.hf_config.eagle_aux_hidden_state_layer_ids"


def speculators_default(n: int) -> list[int]:
    return [2, n // 2, n - 3, n]


def id_problems(ids: Sequence[Any], n: int) -> list[str]:
    """What is wrong with `ids` for a model of n decoder layers (empty: nothing)."""
    problems = []
    dups = sorted({i for i in ids if list(ids).count(i) > 1}, key=str)
    if dups:
        problems.append(f"duplicated {dups}")
    bad = [i for i in ids if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i <= n]
    if bad:
        problems.append(f"outside [0, {n}]: {bad}")
    return problems


def suggested_ids(n: int) -> list[int]:
    return sorted({i for i in (1, n // 2, n - 1, n) if 0 <= i <= n})


def layer_ids_error(ids: Sequence[Any], n: int, model: str, from_text_config: bool) -> str | None:
    """The error for ids that do not fit a model of n decoder layers, or None if they fit."""
    problems = id_problems(ids, n)
    if not problems:
        return None
    source = ", from text_config" if from_text_config else ""
    default = speculators_default(n)
    if list(ids) == default:
        note = f" These are speculators' default [2, n//2, n-3, n], which do not fit n = {n}."
    elif id_problems(default, n):
        note = f" speculators' default [2, n//2, n-3, n] gives {default} here: no fit either."
    else:
        note = ""
    hint = default if not id_problems(default, n) else suggested_ids(n)
    if hint == default:
        note += f" speculators' default here is {default}."
    return (
        f"layer ids {list(ids)} do not fit {model} (n = {n} decoder layers{source}): "
        f"{'; '.join(problems)}. Ids must be distinct and within [0, {n}] (0 = the embeddings, "
        f"i = the output of decoder layer i, {n} = the last, before the final norm).{note} "
        f"Pass distinct ids, e.g. {hint}: --target-layer-ids {' '.join(map(str, hint))} with "
        f"speculators' launcher, or {IDS_FIELD} with `vllm serve`."
    )


def eagle3_error(spec: Any) -> str | None:
    """Why the target's vLLM model class cannot give auxiliary hidden states, or None."""
    from vllm.model_executor.models import ModelRegistry
    from vllm.model_executor.models.interfaces import supports_eagle3

    model = spec.target_model_config
    try:
        cls, arch = ModelRegistry.resolve_model_cls(model.architectures, model_config=model)
    except Exception as exc:  # vLLM reports an unknown or unloadable model itself, later
        logger.debug("speculators-hybrid: no EAGLE-3 check, model class not resolved: %s", exc)
        return None
    if supports_eagle3(cls):
        return None
    return (
        f"hidden-state extraction needs EAGLE-3 auxiliary hidden states, and vLLM "
        f"{installed('vllm')}'s model class {cls.__name__} (architecture {arch}) does not "
        "provide them (it does not implement vLLM's SupportsEagle3). vLLM would fail only "
        "after loading the weights ('Model does not support EAGLE3 interface'). Extract from a "
        f"model whose vLLM class supports EAGLE-3, or use a vLLM release that adds it to "
        f"{cls.__name__}."
    )


def check(spec: Any) -> None:
    """Raise ValueError if an `extract_hidden_states` SpeculativeConfig cannot work."""
    model = spec.target_model_config
    if model is None:
        return
    hf_config = getattr(spec.draft_model_config, "hf_config", None)
    ids = getattr(hf_config, "eagle_aux_hidden_state_layer_ids", None)
    if not ids:
        raise ValueError(
            f"speculators-hybrid: extract_hidden_states needs layer ids: set {IDS_FIELD}, "
            "e.g. speculators' default [2, n//2, n-3, n] for n decoder layers."
        )
    text = model.hf_text_config
    message = layer_ids_error(
        list(ids), text.num_hidden_layers, model.model, text is not model.hf_config
    )
    if message is None:
        message = eagle3_error(spec)
    if message is not None:
        raise ValueError(f"speculators-hybrid: {message}")


def _check_after_post_init(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    result = wrapped(*args, **kwargs)
    if getattr(instance, "method", None) == "extract_hidden_states":
        check(instance)
    return result


PATCH = Patch(
    id="check-extraction-input",
    project="vllm",
    versions=">=0.20",
    fixed_upstream="none yet",
    why=__doc__ or "",
    targets=(
        Target(
            "vllm.config.speculative",
            "SpeculativeConfig.__post_init__",
            _check_after_post_init,
            (
                "a73a0723c62a5b2a",  # 0.20.0-0.20.2
                "069583357bb1a492",  # 0.21.0
                "539fee17d0e9689a",  # 0.22.0-0.22.1
                "49766bfc46a01b6d",  # 0.23.0-0.24.0
                "bf9f6587518cdb7b",  # 0.25.0-0.25.1
                "5d7008579a74859f",  # 0.29.0
                "5effd4415ba14e4e",  # 0.33.0
                "72abd718b530fc73",  # 0.26.0
                "af82ccfee816c548",  # 0.27.0-0.27.1
                "8161a9c20dc72555",  # 0.28.0
                "f22a3a810cce4670",  # 0.30.0
                "98e42cf8771df354",  # 0.31.0-0.32.0
                "582990692acabfba",  # 0.34.0 (per-method config classes; same fields after)
            ),
        ),
    ),
)
