"""The family table (speculators_hybrid/families.py) against this vLLM's own model classes.

Each hybrid family's vLLM class has EAGLE-3 auxiliary hidden states (`SupportsEagle3`) exactly
from the release the table names, with our plugin loaded as vLLM loads it (it registers the
text-only Qwen3.5 classes before 0.27). Every vLLM env of the matrix runs this, so each release
confirms its column of docs/support.md's family table; `launch` and `doctor` refuse by the same
table.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from vllm.model_executor.models import ModelRegistry
from vllm.model_executor.models.interfaces import supports_eagle3

from speculators_hybrid.families import BY_TYPE, FAMILIES, Family
from speculators_hybrid.registry import base_version
from speculators_hybrid.versions import installed
from speculators_hybrid.vllm_patches import mamba_all_mode


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.model_type)
def test_the_family_table_says_what_this_vllm_has(family: Family) -> None:
    release = str(base_version(installed("vllm") or "0"))
    cls = ModelRegistry._try_load_model_cls(family.architecture)
    has = cls is not None and bool(supports_eagle3(cls))
    assert has == family.extracts_on(release), (family, release, cls)


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.model_type)
def test_the_table_says_which_classes_vllm_caches_in_mamba_all_mode(family: Family) -> None:
    """`launch` reads families.py for the model types whose state vLLM caches per block
    (mamba_all_mode.py); the engine asks the class: both must agree wherever it exists. From
    vLLM 0.33.0 there is no 'all' mode (nor the class check): launch must not refuse there."""
    from typing import get_args

    from vllm.config import cache
    from vllm.model_executor.models import interfaces

    supports_mamba_prefix_caching = getattr(interfaces, "supports_mamba_prefix_caching", None)
    if supports_mamba_prefix_caching is None:
        assert "all" not in get_args(cache.MambaCacheMode)
        assert not mamba_all_mode.stops_engine(family.model_type, installed("vllm"))
        return
    cls = ModelRegistry._try_load_model_cls(family.architecture)
    if cls is None:
        pytest.skip(f"vLLM {installed('vllm')} has no {family.architecture}")
    assert bool(supports_mamba_prefix_caching(cls)) == family.mamba_all_mode, family


def _config(tmp_path, model_type: str, arch: str) -> str:
    folder = tmp_path / model_type
    folder.mkdir()
    body = {"architectures": [arch], "model_type": model_type, "num_hidden_layers": 8}
    (folder / "config.json").write_text(json.dumps({**body, "num_attention_heads": 8}))
    return str(folder)


@pytest.mark.parametrize(
    "model_type",
    [
        "qwen3_next",
        "nemotron_h",
        "granitemoehybrid",
        "falcon_h1",
        "lfm2",
        "jamba",
        "lfm2_moe",
        "zamba2",
    ],
)
def test_launch_and_doctor_refuse_where_the_table_says(model_type, tmp_path):
    """In one line, naming the first release that works; elsewhere launch goes ahead."""
    family = BY_TYPE[model_type]
    model = _config(tmp_path, model_type, family.architecture)
    release = str(base_version(installed("vllm") or "0"))
    cli = [sys.executable, "-m", "speculators_hybrid.cli"]
    launch = subprocess.run([*cli, "launch", model, "--dry-run"], capture_output=True, text=True)
    if family.extracts_on(release):
        assert launch.returncode == 0, launch.stderr
        return
    says = f"the first release that has them is vLLM {family.first}"
    doctor = subprocess.run([*cli, "doctor", model], capture_output=True, text=True)
    for name, done in (("launch", launch), ("doctor", doctor)):
        assert done.returncode == 2 and done.stdout == "", done.stderr
        assert done.stderr.startswith(f"speculators-hybrid {name}: error: vLLM {installed('vllm')}")
        assert done.stderr.rstrip().endswith(says) and done.stderr.count("\n") == 1
