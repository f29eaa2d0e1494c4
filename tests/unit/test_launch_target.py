"""Reading the target from config.json: hybrid detection, n, multimodal, the HF cache."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "launchers"))
from launch_support import QWEN3, write_json  # noqa: E402

from speculators_hybrid.launcher import LaunchError, target  # noqa: E402
from speculators_hybrid.models import config_dict, write_config  # noqa: E402


@pytest.mark.parametrize(
    ("config", "hybrid"),
    [
        (config_dict("tiny", multimodal=True), True),
        (config_dict("tiny", multimodal=False), True),
        (config_dict("qwen3.6-27b"), True),
        (QWEN3, False),
        ({"model_type": "qwen3_next", "num_hidden_layers": 4}, True),
        ({"model_type": "nemotron_h", "hybrid_override_pattern": "M-M*"}, True),
        ({"model_type": "qwen3_5_moe", "text_config": {"model_type": "qwen3_5_moe_text"}}, True),
        ({"model_type": "custom", "layer_types": ["linear_attention", "full_attention"]}, True),
        ({"model_type": "custom", "layer_types": ["mamba", "attention"]}, True),
        (
            {"model_type": "gemma3_text", "layer_types": ["sliding_attention", "full_attention"]},
            False,
        ),
        ({"model_type": "llava", "text_config": {"model_type": "llama"}}, False),
        ({"model_type": "odd", "layer_types": 3}, False),
    ],
)
def test_is_hybrid(config, hybrid):
    assert target.is_hybrid(config) is hybrid


def test_multimodal_checkpoint_takes_n_from_text_config(tmp_path):
    config = config_dict("tiny", multimodal=True)
    config["num_hidden_layers"] = 99  # a top-level value is not the language model's
    t = target.load(str(write_json(tmp_path, config)))
    assert (t.num_layers, t.multimodal, t.hybrid, t.model_type) == (8, True, True, "qwen3_5_text")


def test_text_only_checkpoint(tmp_path):
    t = target.load(str(write_config(tmp_path, "tiny", multimodal=False)))
    assert (t.num_layers, t.multimodal, t.hybrid) == (8, False, True)


def test_a_hub_id_is_read_from_the_local_cache_only(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    repo = tmp_path / "models--org--tiny"
    write_json(repo / "snapshots" / "abc", QWEN3)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc\n")
    assert target.load("org/tiny").config_path == repo / "snapshots" / "abc" / "config.json"
    with pytest.raises(LaunchError, match="not a local directory"):
        target.load("org/other")
