"""A vLLM whose code the patches do not fit (a fork, an untested release) runs as without the
plugin; only hidden-state extraction from a hybrid model is refused, in one line.

The "fork" is this vLLM with one comment line added to the first line of a patched function
(its fingerprint changes, its behaviour does not), imported from a mirror ahead of the
installed one, with vLLM's own plugin loader.
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import NO_CHUNKED_PREFILL, PATCHER, model_dir, vllm_patches
from test_layer_zero import QWEN3

from speculators_hybrid.fingerprint import _function_of, resolve

pytestmark = pytest.mark.shim_only  # a fork of a patched vLLM source would test nothing new

PROBE = """
import json, logging, sys
logging.basicConfig(level=logging.INFO)
from speculators_hybrid import cpu, planning
cpu.prepare()
from vllm.plugins import load_general_plugins
load_general_plugins()
from speculators_hybrid.plugin import PATCHER
setups, no_chunked = json.loads(sys.argv[1]), sys.argv[2] == "1"
for name, model, ids in setups:
    # vLLM 0.22.x's connector refuses chunked prefill (conftest.NO_CHUNKED_PREFILL)
    chunked = False if no_chunked and ids else None
    setup = planning.Setup(
        model=model, layer_ids=tuple(ids) if ids else None, max_model_len=1024,
        chunked_prefill=chunked,
    )
    try:
        planning.engine_config(setup)
        print(name, "BUILT")
    except Exception as exc:
        print(name, "REFUSED", type(exc).__name__, str(exc).replace("\\n", " | "))
print("APPLIED", ",".join(PATCHER.applied()) or "-")
"""


def _first_target():
    """The first selected target whose module vLLM imports while it builds a config."""
    for patch in PATCHER.select(vllm_patches()):
        for target in patch.targets_for(PATCHER.version_of("vllm")):
            if target.module.startswith("vllm.config"):
                return patch, target
    pytest.skip("no selected patch targets vLLM's config modules on this release")


def fork(dest: Path) -> tuple[Path, str]:
    """A mirror of the installed vLLM with one target's first line followed by a comment."""
    import importlib

    import vllm

    patch, target = _first_target()
    package = Path(vllm.__file__).parent
    mirror = dest / "vllm"
    shutil.copytree(
        package, mirror, copy_function=os.symlink, ignore=shutil.ignore_patterns("__pycache__")
    )
    found = resolve(importlib.import_module(target.module), target.attr)
    assert found is not None, target.name
    function = inspect.unwrap(_function_of(found[2]))  # our wrapper, if applied, unwrapped
    path = Path(inspect.getsourcefile(function) or "")
    first = function.__code__.co_firstlineno  # 1-based: the def line (or its decorator)
    copy = mirror / path.relative_to(package)
    lines = path.read_text().splitlines(keepends=True)
    copy.unlink()
    copy.write_text("".join(lines[:first] + ["# a fork's edit\n"] + lines[first:]))
    return dest, target.name


def probe(path: Path, setups: list[tuple[str, str, tuple[int, ...] | None]]) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_PLUGINS",)}
    env["PYTHONPATH"] = os.pathsep.join([str(path), env.get("PYTHONPATH", "")])
    env["SPECULATORS_HYBRID_DISABLE"] = ""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(setups), "1" if NO_CHUNKED_PREFILL else "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout + done.stderr


@pytest.mark.full_tier
def test_a_fork_serves_as_without_the_plugin_and_refuses_hybrid_extraction(shim, tmp_path):
    path, changed = fork(tmp_path)
    dense = tmp_path / "qwen3"
    dense.mkdir()
    (dense / "config.json").write_text(json.dumps(QWEN3))
    hybrid = model_dir("tiny")
    out = probe(
        path,
        [
            ("hybrid-plain", hybrid, None),
            ("dense-extraction", str(dense), (1, 4, 8)),
            ("hybrid-extraction", hybrid, (1, 4, 8)),
        ],
    )
    assert "hybrid-plain BUILT" in out, out[-4000:]
    assert "dense-extraction BUILT" in out, out[-4000:]
    assert "APPLIED -" in out  # nothing patched
    refused = [line for line in out.splitlines() if line.startswith("hybrid-extraction")]
    assert len(refused) == 1 and " REFUSED ExtractionRefused " in refused[0], out[-4000:]
    line = refused[0]
    assert changed in line and "nothing was patched" in line, line
    assert "SPECULATORS_HYBRID_DISABLE=1" in line and "tested vLLM release" in line, line
    assert " | " not in line  # one line


@pytest.mark.full_tier
def test_the_same_configs_on_this_vllm_apply_every_patch(shim, tmp_path):
    """The control: without the fork's edit, the same probe patches and extracts."""
    out = probe(tmp_path, [("hybrid-extraction", model_dir("tiny"), (1, 4, 8))])
    assert "hybrid-extraction BUILT" in out, out[-4000:]
    every = ",".join(p.id for p in PATCHER.select(vllm_patches()))
    assert f"APPLIED {every}\n" in out
