"""The adjusted command against the installed vLLM's own CLI parser and config validation (CPU,
in a subprocess; runs in the tox envs that have vLLM). The plugin is switched off there: this
checks the flags we add or drop, not the KV-cache patches; except on vLLM 0.22-0.23, where the
dropped --no-enable-chunked-prefill is accepted through our plugin
(hidden-states-chunked-prompts)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "launchers"))
from launch_support import GENERATIONS, HERE, REPO, models  # noqa: E402
from packaging.version import Version  # noqa: E402

from speculators_hybrid import launch  # noqa: E402
from speculators_hybrid.launcher.adjust import FIRST_LANGUAGE_ONLY  # noqa: E402
from speculators_hybrid.versions import installed  # noqa: E402
from speculators_hybrid.vllm_patches.chunked_prompts import PATCH as CHUNKED_PROMPTS  # noqa: E402

pytest.importorskip("vllm")
pytest.importorskip("transformers")


def vllm_accepts(argv: list[str]) -> dict:
    env = {**os.environ, "SPECULATORS_HYBRID_DISABLE": "1", "VLLM_LOGGING_LEVEL": "ERROR"}
    if CHUNKED_PROMPTS.needed_for(installed("vllm")):
        del env["SPECULATORS_HYBRID_DISABLE"]
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, str(HERE / "vllm_config_check.py"), json.dumps(argv)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith(("OK", "FAIL"))]
    assert lines and lines[-1].startswith("OK "), lines or proc.stderr[-2000:]
    return json.loads(lines[-1][3:])


def test_vllm_accepts_the_adjusted_command_of_a_forcing_launcher(tmp_path):
    """0.7.x forces --no-enable-chunked-prefill; on vLLM 0.33 that fails for hybrids (prefix
    caching is on by default there and mamba needs chunked prefill), ours does not."""
    model = models(tmp_path)["hybrid-mm"]
    cmd, _ = launch.plan(["--launcher", str(GENERATIONS["0.7.x"]), str(model)])
    accepted = vllm_accepts(cmd.argv)
    if Version(installed("vllm") or "0") >= FIRST_LANGUAGE_ONLY:
        assert accepted["language_model_only"] is True
    else:  # vLLM 0.20.0 has no --language-model-only: launch leaves it out (and says so)
        assert "--language-model-only" not in cmd.argv and accepted["language_model_only"] is False
