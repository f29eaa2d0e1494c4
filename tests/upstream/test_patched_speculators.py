"""patches/speculators/<installed release>: the diffs apply, and they are the same fix as the shim.

1. Each diff applies, in order, to the installed (pristine) release.
2. A copy of the installed speculators with the diffs applied, the shim off, builds each
   algorithm's draft model on tiny verifiers: the frozen verifier norm equals transformers' own
   final norm bit for bit (`x * (1 + w)` for Qwen3.5 / Qwen3.5-MoE / Qwen3-Next, `x * w` else).
3. The same copy on tiny Granite 4.0-H and Falcon-H1 models saved by transformers: the verifier
   head on the model's final-norm output gives the model's logits bit for bit (fp32 and bf16:
   the logit scale, after the matmul); other verifiers keep a plain nn.Linear head.
4. From 0.8.0 (the wheel's draft-config builder): the same copy builds the default draft config
   of tiny Nemotron-H and LFM2 models with each model's own final-norm eps and activation silu;
   the other families keep their `rms_norm_eps`.
5. From 0.8.0 (MTP): the same copy's MTP drafter for a tiny Qwen3.5 verifier with a native head
   computes, on the state before the final norm (the files' last id), bit for bit what the same
   head computes on the final norm's output (what vLLM serves it); a qwen3 verifier's is as before.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from packaging.version import Version
from patched_release import REPO, check_failures, patched, release

VERSION = release("speculators")

pytestmark = pytest.mark.skipif(VERSION is None, reason="needs an installed speculators release")


def probe(tmp_path, code: str, *args: str) -> list[str]:
    """`code` run on a patched copy of the installed release (shim off): its output lines."""
    copy, env = patched("speculators", tmp_path / "src", REPO / "tests" / "speculators")
    done = subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-4000:]
    lines = done.stdout.splitlines()
    assert f"FROM {copy / '__init__.py'}" in lines
    return lines


PROBE = """
import sys, tempfile
from pathlib import Path
import torch
import speculators
from packaging.version import Version
from tiny_models import ONE_PLUS_W, build, transformers_norm, write_verifier
print("FROM", speculators.__file__)
algorithms = ("eagle3", "dflash") if Version(sys.argv[1]) >= Version("0.6.0") else ("eagle3",)
root = Path(tempfile.mkdtemp(dir=".")).resolve()  # under the test's tmp_path
for model_type in ONE_PLUS_W + ("qwen3", "llama"):
    path, weight = write_verifier(root, model_type)
    reference = transformers_norm(model_type if model_type in ONE_PLUS_W else "qwen3", weight)
    for algorithm in algorithms:
        norm = build(algorithm, path).verifier_norm
        x = torch.randn(2, 7, 64) * 3
        same = all(torch.equal(norm(v), reference(v)) for v in (x, x.to(torch.bfloat16)))
        print("NORM", algorithm, model_type, "same" if same else "DIFFERENT")
"""


def test_every_diff_applies_to_the_installed_release():
    assert check_failures("speculators") == []


def test_patched_source_gives_the_verifiers_own_norm(tmp_path):
    assert VERSION is not None
    lines = probe(tmp_path, PROBE, VERSION)
    norms = [line.split()[1:] for line in lines if line.startswith("NORM ")]
    assert len(norms) == 7 * (2 if Version(VERSION) >= Version("0.6.0") else 1)
    assert [n for n in norms if n[2] != "same"] == []


LOGIT_PROBE = """
import copy, sys, tempfile, warnings
from pathlib import Path
import torch
import speculators
from packaging.version import Version
from tiny_models import build, final_norm, write_family, write_verifier
print("FROM", speculators.__file__)
version = Version(sys.argv[1])
algorithms = ("eagle3", "dflash") if version >= Version("0.6.0") else ("eagle3",)
# speculators 0.5.0 asks for exactly model.norm.weight: no Falcon-H1 (final_layernorm) verifier
families = ("granitemoehybrid",) + (("falcon_h1",) if version >= Version("0.6.0") else ())
root = Path(tempfile.mkdtemp(dir=".")).resolve()  # under the test's tmp_path
warnings.simplefilter("ignore")
for model_type in families:
    path, model = write_family(root, model_type)
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, model.config.vocab_size, (1, 9), generator=gen)
    for algorithm in algorithms:
        head = build(algorithm, path).verifier_lm_head
        same = []
        for dtype in (torch.float32, torch.bfloat16):
            theirs, seen = copy.deepcopy(model).to(dtype), {}
            final_norm(theirs).register_forward_hook(lambda _m, _a, out: seen.update(post=out))
            with torch.no_grad():
                logits = theirs(ids, use_cache=False).logits
                same.append(torch.equal(copy.deepcopy(head).to(dtype)(seen["post"]), logits))
        print("LOGITS", algorithm, model_type, "same" if all(same) else "DIFFERENT")
path, _ = write_verifier(root, "qwen3")
for algorithm in algorithms:
    plain = type(build(algorithm, path).verifier_lm_head) is torch.nn.Linear
    print("LOGITS", algorithm, "qwen3", "same" if plain else "DIFFERENT")
"""


def test_patched_source_gives_the_verifiers_own_logits(tmp_path):
    assert VERSION is not None
    lines = probe(tmp_path, LOGIT_PROBE, VERSION)
    found = [line.split()[1:] for line in lines if line.startswith("LOGITS ")]
    assert len(found) == (6 if Version(VERSION) >= Version("0.6.0") else 2)
    assert [n for n in found if n[2] != "same"] == []


DRAFT_PROBE = """
import tempfile, warnings
from pathlib import Path
import speculators
from speculators.train.cli import create_transformer_layer_config
from tiny_models import HYBRID, family_eps, write_family
print("FROM", speculators.__file__)
print("FAMILIES", len(HYBRID))
root = Path(tempfile.mkdtemp(dir=".")).resolve()  # under the test's tmp_path
warnings.simplefilter("ignore")
for model_type in HYBRID:
    path, model = write_family(root, model_type)
    for act in (None, "silu"):
        config = create_transformer_layer_config(path, 1, "llama", act, 0, [0])
        ok = config.rms_norm_eps == family_eps(model) and (act or config.hidden_act)
        print("DRAFT", model_type, act, "same" if ok else "DIFFERENT")
"""


@pytest.mark.skipif(
    VERSION is None or Version(VERSION) < Version("0.8.0"),
    reason="speculators 0.7.0 builds the draft config in scripts/train.py, outside the wheel",
)
def test_patched_source_builds_the_draft_config_with_the_verifiers_eps(tmp_path):
    assert VERSION is not None
    lines = probe(tmp_path, DRAFT_PROBE)
    found = [line.split()[1:] for line in lines if line.startswith("DRAFT ")]
    (families,) = [int(line.split()[1]) for line in lines if line.startswith("FAMILIES ")]
    assert len(found) == 2 * families >= 14  # every family, with and without an activation
    assert {"nemotron_h", "lfm2", "lfm2_moe"} <= {n[0] for n in found}
    assert [n for n in found if n[2] != "same"] == []


MTP_PROBE = """
import tempfile, warnings
from pathlib import Path
import torch
import speculators
from tiny_models import build_mtp, transformers_norm, write_mtp_verifier
print("FROM", speculators.__file__)
root = Path(tempfile.mkdtemp(dir=".")).resolve()  # under the test's tmp_path
warnings.simplefilter("ignore")
path, weight = write_mtp_verifier(root, "qwen3_5_text")
model = build_mtp(path)
gen = torch.Generator().manual_seed(2)
ids, x = torch.randint(0, 128, (1, 12), generator=gen), torch.randn(1, 12, 64, generator=gen) * 3
with torch.no_grad():
    got = model(input_ids=ids, hidden_states=x)[0]
    loaded = torch.equal(model.verifier_norm.weight, weight)
    del model.verifier_norm  # the same head without the norm, on what vLLM serves it
    wanted = model(input_ids=ids, hidden_states=transformers_norm("qwen3_5_text", weight)(x))[0]
print("MTP qwen3_5_text", "same" if loaded and all(map(torch.equal, got, wanted)) else "DIFFERENT")
plain = not hasattr(build_mtp(write_mtp_verifier(root, "qwen3")[0]), "verifier_norm")
print("MTP qwen3", "same" if plain else "DIFFERENT")
"""


@pytest.mark.skipif(
    VERSION is None or Version(VERSION) < Version("0.8.0"), reason="MTP from speculators 0.8.0"
)
def test_patched_source_trains_the_mtp_head_on_what_vllm_serves(tmp_path):
    lines = probe(tmp_path, MTP_PROBE)
    found = [line.split()[1:] for line in lines if line.startswith("MTP ")]
    assert found == [["qwen3_5_text", "same"], ["qwen3", "same"]]
