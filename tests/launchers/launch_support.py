"""Shared by tests/unit/test_launch*.py: the launcher doubles, target configs, the fake vLLM."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from speculators_hybrid.models import config_dict, write_config

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
FAKE_VLLM = HERE / "fake_vllm"
GENERATIONS = {
    "0.5.0": HERE / "launch_vllm_0_5.py",
    "0.6.x": HERE / "launch_vllm_0_6.py",
    "0.7.x": HERE / "launch_vllm_0_7.py",
    "main": HERE / "launch_vllm_main.py",
}
FORCES_NO_CHUNKED = {"0.6.x", "0.7.x"}

QWEN3 = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "num_hidden_layers": 8,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": 1024,
    "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16",
}


def write_json(folder: Path, config: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def models(root: Path) -> dict[str, Path]:
    """hybrid-mm (Qwen3.5 with vision), hybrid-text (qwen3_5_text), plain (Qwen3), each 8
    layers; hybrid-4 (a 4-layer text hybrid: speculators' default ids collide there)."""
    four = config_dict("tiny", multimodal=False)
    four["num_hidden_layers"] = 4
    four["layer_types"] = four["layer_types"][:4]
    return {
        "hybrid-mm": write_config(root / "hybrid-mm", "tiny", multimodal=True),
        "hybrid-text": write_config(root / "hybrid-text", "tiny", multimodal=False),
        "plain": write_json(root / "plain", QWEN3),
        "hybrid-4": write_json(root / "hybrid-4", four),
    }


def env(out: Path, **extra: str) -> dict[str, str]:
    """The environment for a subprocess whose `python -m vllm...` is the fake vLLM."""
    base = {k: v for k, v in os.environ.items() if k != "VLLM_PLUGINS"}
    path = [str(FAKE_VLLM), str(REPO), base.get("PYTHONPATH", "")]
    return {
        **base,
        "PYTHONPATH": os.pathsep.join(p for p in path if p),
        "FAKE_VLLM_OUT": str(out),
        **extra,
    }


def run(args: list[str], env: dict[str, str]) -> tuple[subprocess.Popen[str], str, str]:
    proc = subprocess.Popen(
        [sys.executable, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    stdout, stderr = proc.communicate(timeout=120)
    return proc, stdout, stderr


def record(out: Path) -> dict[str, Any]:
    return json.loads(out.read_text())
