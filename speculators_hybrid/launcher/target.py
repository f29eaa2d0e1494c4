"""What the launcher needs to know about the target, read from its `config.json` (no network,
no transformers)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from speculators_hybrid import families
from speculators_hybrid.launcher import LaunchError

# Model types whose decoder mixes attention with recurrent state layers (GDN, Mamba, conv).
HYBRID_MODEL_TYPES = frozenset(f.model_type for f in families.FAMILIES)
STATE_LAYER_TYPES = frozenset({"linear_attention", "mamba", "conv"})


def _parts(config: dict[str, Any]) -> list[dict[str, Any]]:
    text = config.get("text_config")
    return [config, text] if isinstance(text, dict) else [config]


def is_hybrid(config: dict[str, Any]) -> bool:
    """Attention + state layers: by model type, or by a state layer in `layer_types`."""
    for part in _parts(config):
        if part.get("model_type") in HYBRID_MODEL_TYPES:
            return True
        types = part.get("layer_types")
        if isinstance(types, list) and STATE_LAYER_TYPES & {str(t) for t in types}:
            return True
    return False


def layer_count(text: dict[str, Any]) -> int | None:
    """The decoder's layer count as transformers reads it from a (text) config: its
    `num_hidden_layers`, or where a config class derives it and does not save it (Nemotron-H
    saved by transformers 5), the length of the layer pattern (`layers_block_type`, or the
    older `hybrid_override_pattern`). None when the config has none of them."""
    n = text.get("num_hidden_layers")
    if isinstance(n, int) and not isinstance(n, bool):
        return n
    for key in ("layers_block_type", "hybrid_override_pattern"):
        pattern = text.get(key)
        if isinstance(pattern, (list, str)) and pattern:
            return len(pattern)
    return None


@dataclass(frozen=True)
class Target:
    model: str
    config_path: Path
    config: dict[str, Any]

    @property
    def text(self) -> dict[str, Any]:
        """The language model's config: `text_config` when there is one (as the launchers do)."""
        return _parts(self.config)[-1]

    @property
    def num_layers(self) -> int:
        n = layer_count(self.text)
        if n is None:
            raise LaunchError(
                f"{self.config_path} gives no layer count: no integer num_hidden_layers, nor a "
                "layers_block_type list or hybrid_override_pattern string"
            )
        return n

    @property
    def hybrid(self) -> bool:
        return is_hybrid(self.config)

    @property
    def multimodal(self) -> bool:
        return "text_config" in self.config and "vision_config" in self.config

    @property
    def model_type(self) -> str:
        return str(self.text.get("model_type") or self.config.get("model_type") or "?")


# Head counts tensor parallelism must divide (attention, Gated DeltaNet, Mamba-2), as vLLM's
# layers assert; KV heads and Mamba-2 groups may also be replicated (TP a multiple of them).
TP_SPLIT = (
    "num_attention_heads",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "mamba_num_heads",
)
TP_SPLIT_OR_REPLICATE = ("num_key_value_heads", "n_groups")


def _tp_fits(config: dict[str, Any], tp: int) -> list[str]:
    misfits = []
    for key in (*TP_SPLIT, *TP_SPLIT_OR_REPLICATE):
        n = config.get(key)
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            continue
        if n % tp and not (key in TP_SPLIT_OR_REPLICATE and tp % n == 0):
            misfits.append(f"{key} {n}")
    return misfits


def tp_error(target: Target, tp: int) -> str | None:
    """Why `tp` ranks cannot split this model's heads (None: they can), with sizes that fit."""
    if tp < 1:
        return f"tensor parallel size {tp}: it must be 1 or more"
    misfits = _tp_fits(target.text, tp)
    if not misfits:
        return None
    fits = [str(t) for t in range(1, 65) if not _tp_fits(target.text, t)]
    return (
        f"tensor parallel size {tp} does not divide {target.model}'s {', '.join(misfits)}; "
        f"sizes that fit: {', '.join(fits)}"
    )


def _hub_cache() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(
        os.path.expanduser("~"), ".cache", "huggingface"
    )
    return Path(home) / "hub"


def _cached_config(model: str) -> Path | None:
    """config.json of a hub id already in the local Hugging Face cache (never downloads)."""
    if model.count("/") > 1:
        return None
    repo = _hub_cache() / ("models--" + model.replace("/", "--"))
    ref = repo / "refs" / "main"
    if ref.is_file():
        path = repo / "snapshots" / ref.read_text().strip() / "config.json"
        if path.is_file():
            return path
    found = sorted(repo.glob("snapshots/*/config.json"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def config_path(model: str) -> Path:
    folder = Path(model).expanduser()
    if folder.is_dir():
        path = folder / "config.json"
        if not path.is_file():
            raise LaunchError(f"model directory {model} has no config.json")
        return path
    if folder.is_file():
        raise LaunchError(
            f"{model} is a file: give the model's folder, the one holding config.json "
            f"({folder.parent})"
        )
    if folder.exists() or model.startswith((".", "/", "~")):
        raise LaunchError(f"model directory {model} does not exist or is not a directory")
    cached = _cached_config(model)
    if cached is None:
        raise LaunchError(
            f"model {model!r} is not a local directory (nor in the Hugging Face cache); "
            "download it first, e.g. `huggingface-cli download MODEL --local-dir DIR`, "
            "and pass DIR"
        )
    return cached


def load(model: str) -> Target:
    path = config_path(model)
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise LaunchError(f"cannot read {path}: {exc}") from exc
    if not isinstance(config, dict):
        raise LaunchError(f"{path} is not a JSON object")
    return Target(model, path, config)
