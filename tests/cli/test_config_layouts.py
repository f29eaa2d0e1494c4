"""The up-front checks (`launch`, `doctor`, `verify`) read a config as transformers does, for
every family of families.py: configs saved by this env's own transformers (a fine-tune saved
today) and the published hub-format configs of family_presets.py and models.py. transformers'
config class is the reference: the layer count, the model type, the heads TP must divide."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

transformers = pytest.importorskip("transformers")

from speculators_hybrid import family_presets, models  # noqa: E402
from speculators_hybrid.families import FAMILIES  # noqa: E402
from speculators_hybrid.launcher import target  # noqa: E402

HEADS = (*target.TP_SPLIT, *target.TP_SPLIT_OR_REPLICATE)


def saved_by_transformers(model_type: str, folder: Path) -> Path:
    from transformers import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        pytest.skip(f"transformers {transformers.__version__} has no {model_type} config")
    CONFIG_MAPPING[model_type]().save_pretrained(folder)
    return folder


def agrees_with_transformers(folder: Path) -> None:
    from transformers import AutoConfig

    reference = AutoConfig.from_pretrained(folder).get_text_config()
    ours = target.load(str(folder))
    assert ours.num_layers == reference.num_hidden_layers
    assert ours.model_type == reference.model_type
    assert ours.hybrid
    for key in HEADS:  # read from the JSON as saved; the class's value where it has the key
        if key in ours.text and hasattr(reference, key):
            assert ours.text[key] == getattr(reference, key), key


@pytest.mark.parametrize("model_type", [f.model_type for f in FAMILIES])
def test_a_config_saved_by_this_transformers(model_type, tmp_path):
    agrees_with_transformers(saved_by_transformers(model_type, tmp_path))


PUBLISHED: dict[str, Any] = {
    **{name: (family_presets.write_family_config, name) for name in family_presets.PRESETS},
    **{name: (models.write_config, name) for name in ("qwen3.6-27b-like", "tiny")},
}


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_a_published_config(name, tmp_path):
    write, preset = PUBLISHED[name]
    write(tmp_path, preset)
    agrees_with_transformers(tmp_path)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "speculators_hybrid.cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_nemotron_h_8b_fine_tuned_and_saved_today(tmp_path):
    """The published Nemotron-H-8B config loaded and saved again by this transformers, as a
    fine-tune is: transformers 5 saves `layers_block_type` and no `num_hidden_layers`."""
    from transformers import AutoConfig

    family_presets.write_family_config(tmp_path / "hub", "nemotron-h-8b")
    AutoConfig.from_pretrained(tmp_path / "hub").save_pretrained(tmp_path / "saved")
    saved = json.loads((tmp_path / "saved" / "config.json").read_text())
    if "num_hidden_layers" in saved:
        pytest.skip(f"transformers {transformers.__version__} saves num_hidden_layers")
    done = cli("launch", str(tmp_path / "saved"), "--dry-run")
    if "has no EAGLE-3 auxiliary hidden states" in done.stderr:
        pytest.skip("this vLLM cannot extract from nemotron_h")
    assert done.returncode == 0, done.stderr
    assert '"eagle_aux_hidden_state_layer_ids": [2, 26, 49, 52]' in done.stdout
    done = cli("doctor", str(tmp_path / "saved"), "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["setup"]["layer_ids"] == [2, 26, 49, 52]
