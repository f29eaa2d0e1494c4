"""What every hidden-state file we write shares, whichever connector writes it.

Provenance: safetensors metadata naming the writer (readers that ignore metadata, such as
speculators', are unaffected; `speculators-hybrid check` reads it). The opt-in guard
(`kv_connector_extra_config["refuse_bad_hidden_states"]` or `SPECULATORS_HYBRID_REFUSE_BAD=1`):
a file with NaN/Inf or all-zero token rows is not written; `<path>.rejected` says why.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from speculators_hybrid import switches
from speculators_hybrid.hidden_files import PATCHES_KEY, leave_marker

if TYPE_CHECKING:
    import torch
    from vllm.config import VllmConfig

logger = logging.getLogger("vllm.speculators_hybrid")

GUARD_KEY = "refuse_bad_hidden_states"  # in kv_connector_extra_config


def opted_in(extra_config: Any, key: str, env: str) -> bool:
    """`kv_connector_extra_config[key]` or the variable `env` set to 1/true/yes."""
    flag = switches.on(env)
    return flag or bool(extra_config(key, False))


def guard_enabled(extra_config: Any) -> bool:
    """Opt-in: `kv_connector_extra_config[GUARD_KEY]` or SPECULATORS_HYBRID_REFUSE_BAD."""
    return opted_in(extra_config, GUARD_KEY, switches.REFUSE_BAD)


def bad_rows(hidden: torch.Tensor) -> str | None:
    """Why `hidden` [tokens, ids, hidden] must not be published, or None."""
    import torch

    finite = torch.isfinite(hidden).reshape(hidden.shape[0], -1).all(dim=1)
    if not bool(finite.all()):
        return f"NaN or Inf at token rows {_first(~finite)}"
    zero = (hidden == 0).reshape(hidden.shape[0], -1).all(dim=1)
    if bool(zero.any()):
        return f"all-zero hidden states at token rows {_first(zero)}"
    return None


def _first(mask: torch.Tensor, n: int = 8) -> str:
    rows = mask.nonzero().flatten().tolist()
    return ", ".join(map(str, rows[:n])) + (f" (+{len(rows) - n} more)" if len(rows) > n else "")


def refuse(path: str, problem: str) -> None:
    """Leave `<path>.rejected` with the reason instead of the file."""
    logger.error("speculators-hybrid: refusing %s: %s", path, problem)
    leave_marker(path, problem)


def provenance(vllm_config: VllmConfig) -> dict[str, str]:
    """Who wrote a file, as safetensors metadata."""
    import hashlib
    import json

    import speculators_hybrid
    from speculators_hybrid.registry import patcher
    from speculators_hybrid.versions import installed

    model = vllm_config.model_config
    draft = vllm_config.speculative_config.draft_model_config.hf_config  # type: ignore[union-attr]
    config_json = json.dumps(model.hf_config.to_dict(), sort_keys=True, default=str)
    return {
        "writer": "speculators-hybrid",
        "speculators_hybrid_version": speculators_hybrid.__version__,
        "vllm_version": installed("vllm") or "unknown",
        PATCHES_KEY: json.dumps([p.id for p in patcher().selected]),
        "layer_ids": json.dumps(list(draft.eagle_aux_hidden_state_layer_ids)),
        "model": str(model.model),
        "model_config_sha256": hashlib.sha256(config_json.encode()).hexdigest(),
    }


def save_whole(
    path: str, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None
) -> None:
    """Write `path` aside, then rename it into place: no reader sees it incomplete.

    Aside is a folder of its own, `<path>.<pid>.part/`, next to `path` (one filesystem, so the
    rename is atomic): whatever the writer leaves there goes with the folder, here on failure,
    or by `file_names.sweep` at the next start if the process was killed. The bytes go out
    through `safetensors_file.write` (the GIL free while they do);
    SPECULATORS_HYBRID_SAFETENSORS_SAVE=1 uses safetensors' own `save_file` instead (which
    writes its own `.tmpXXXXXX` first).
    """
    import shutil

    from speculators_hybrid import safetensors_file  # numpy: not for the launcher's imports

    aside = f"{path}.{os.getpid()}.part"
    try:
        os.mkdir(aside)  # one call: a writer thread waits for the GIL after each
    except OSError:  # there already, or its folder is not (yet)
        os.makedirs(aside, exist_ok=True)
    inner = os.path.join(aside, "data")
    try:
        if switches.on(switches.SAFETENSORS_SAVE):
            from safetensors.torch import save_file

            save_file(tensors, inner, metadata=metadata)
        else:
            safetensors_file.write(inner, tensors, metadata)
        os.replace(inner, path)
    except BaseException:
        shutil.rmtree(aside, ignore_errors=True)
        raise
    try:
        os.rmdir(aside)
    except OSError:  # something else was left there
        shutil.rmtree(aside, ignore_errors=True)
