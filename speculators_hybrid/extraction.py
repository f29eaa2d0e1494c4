"""What speculators asks vLLM for: the layer ids and the extraction request.

speculators' launcher starts vLLM with an `extract_hidden_states` speculative config naming the
layer ids (default `[2, n//2, n-3, n]` for n decoder layers) and a kv-transfer config for the
hidden-states connector. The id rules here are the ones the launcher, `doctor`, `verify` and the
vLLM-side check (vllm_patches/extraction_input.py) all apply.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

IDS_FIELD = "speculative_config.draft_model_config.hf_config.eagle_aux_hidden_state_layer_ids"
STORAGE = "/tmp/hidden_states"  # noqa: S108 (speculators' default --hidden-states-path)


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


def layer_ids_error(
    ids: Sequence[Any], n: int, model: str, from_text_config: bool, flag: str | None = None
) -> str | None:
    """The error for ids that do not fit a model of n decoder layers, or None if they fit;
    `flag`: the option that takes them (default: the launcher's, or vLLM's field)."""
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
        + (
            f"Pass distinct ids, e.g. {flag} {' '.join(map(str, hint))}."
            if flag
            else f"Pass distinct ids, e.g. {hint}: --target-layer-ids {' '.join(map(str, hint))} "
            f"with speculators' launcher, or {IDS_FIELD} with `vllm serve`."
        )
    )


def speculative_config(layer_ids: Sequence[int]) -> dict[str, Any]:
    """vLLM's `--speculative_config` for extraction at `layer_ids`."""
    return {
        "method": "extract_hidden_states",
        "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": list(layer_ids)}},
    }


def kv_transfer_config(storage: str = STORAGE) -> dict[str, Any]:
    """vLLM's `--kv_transfer_config` for the file connector writing under `storage`."""
    return {
        "kv_connector": "ExampleHiddenStatesConnector",
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": storage},
    }


def extraction_args(layer_ids: Sequence[int], storage: str = STORAGE) -> dict[str, Any]:
    """The `speculative_config` and `kv_transfer_config` speculators' launcher passes."""
    return {
        "speculative_config": speculative_config(layer_ids),
        "kv_transfer_config": kv_transfer_config(storage),
    }
