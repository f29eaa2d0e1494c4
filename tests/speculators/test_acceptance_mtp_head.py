"""benchmarks/acceptance/mtp_head.py on the CPU: the native MTP head it gives the loop's target
is one speculators 0.9.0 finetunes and stitches back, and the target itself is unchanged.

The target is the acceptance loop's own (`target.py`, stdlib-tiny, untrained). speculators' own
code reads the head (`MTPDraftModel.from_training_args`, its converter) and puts a finetuned one
back (`speculators stitch-mtp`, its CLI, in a subprocess as the loop runs it); transformers' model
gives the same logits with and without the head.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import VERSION, acceptance_script
from packaging.version import Version
from safetensors.torch import load_file
from tiny_models import TO_CHECKPOINT, checkpoint_name

if VERSION < Version("0.9.0"):
    pytest.skip("the acceptance loop runs speculators 0.9.0", allow_module_level=True)

WEIGHTS = "model.safetensors"


def target_logits(target: Path) -> torch.Tensor:
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(target, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(input_ids=torch.arange(40).unsqueeze(0), use_cache=False).logits


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, Any]:
    """The target, its logits and weights before the head, then the head added."""
    target = tmp_path_factory.mktemp("mtp") / "target"
    args = ["--device", "cpu", "--limit-files", "30", "--seconds", "0", "--eval-chats", "2"]
    assert acceptance_script("target").main([str(target), *args]) == 0
    before = {"logits": target_logits(target), "weights": load_file(str(target / WEIGHTS))}
    assert acceptance_script("mtp_head").main([str(target)]) == 0
    return {"target": target, **before}


def test_the_target_computes_what_it_did(made) -> None:
    assert torch.equal(target_logits(made["target"]), made["logits"])
    weights = load_file(str(made["target"] / WEIGHTS))
    assert all(torch.equal(weights[k], v) for k, v in made["weights"].items())
    added = sorted(set(weights) - set(made["weights"]))
    assert added and all(k.startswith("mtp.") for k in added)


def test_a_second_run_changes_nothing(made, capsys) -> None:
    path = made["target"] / WEIGHTS
    size, mtime = path.stat().st_size, path.stat().st_mtime_ns
    assert acceptance_script("mtp_head").main([str(made["target"])]) == 0
    assert "already has an MTP head" in capsys.readouterr().out
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (size, mtime)


def test_bad_input_is_one_line(tmp_path, capsys) -> None:
    assert acceptance_script("mtp_head").main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no config.json" in err


def draft(target: Path) -> Any:
    """speculators' MTP model as `speculators train --speculator-type mtp` builds it."""
    from speculators.models.mtp.core import MTPDraftModel
    from speculators.train.cli import get_verifier_config

    config = get_verifier_config(str(target), trust_remote_code=False)
    return MTPDraftModel.from_training_args(config, verifier_name_or_path=str(target))


def test_speculators_finetunes_the_head_it_adds(made) -> None:
    weights = load_file(str(made["target"] / WEIGHTS))
    head = {k: v for k, v in draft(made["target"]).state_dict().items() if k.startswith("mtp_")}
    assert {checkpoint_name(k) for k in head} == {k for k in weights if k.startswith("mtp.")}
    for key, value in head.items():
        assert torch.equal(value.to(torch.bfloat16), weights[checkpoint_name(key)]), key
    norms = {checkpoint_name(k) for k in head if "norm" in k.split(".")[-2]}
    assert len(norms) == 7 and not any(weights[k].any() for k in norms)  # 1 + w, w = 0
    assert len(TO_CHECKPOINT) == 5  # fc, the three norms and the decoder layer


def test_stitch_mtp_puts_a_finetuned_head_back(made, tmp_path) -> None:
    model = draft(made["target"])
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.startswith("mtp_layers."):
                param.add_(0.5)  # "finetuned"
    finetuned = {k: v for k, v in model.state_dict().items() if k.startswith("mtp_layers.")}
    model.to(torch.bfloat16).save_pretrained(tmp_path / "ck")
    out = tmp_path / "stitched"
    cmd = [sys.executable, "-m", "speculators", "stitch-mtp", str(tmp_path / "ck")]
    done = subprocess.run(
        [*cmd, str(made["target"]), "--output-path", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    stitched, original = load_file(str(out / WEIGHTS)), load_file(str(made["target"] / WEIGHTS))
    assert set(stitched) == set(original)
    for key, value in stitched.items():
        ours = finetuned.get(next((k for k in finetuned if checkpoint_name(k) == key), ""))
        expected = original[key] if ours is None else ours.to(torch.bfloat16)
        assert torch.equal(value, expected), key
    assert (out / "config.json").read_text() == (made["target"] / "config.json").read_text()
