"""vLLM's own plugin loader arms our patches, honouring VLLM_PLUGINS and our off switch."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import PATCHER, vllm_patches

PROBE = (
    "import importlib, logging\n"
    "logging.basicConfig(level=logging.INFO)  # vLLM 0.33 configures logging only at engine start\n"
    "from speculators_hybrid import cpu; cpu.prepare()\n"
    "from vllm.plugins import load_general_plugins; load_general_plugins()\n"
    "from speculators_hybrid.plugin import PATCHER, vllm_patches\n"
    "for p in PATCHER.select(vllm_patches()):\n"
    "    for t in p.targets_for(PATCHER.version_of('vllm')):\n"
    "        importlib.import_module(t.module)\n"
    "print('ARMED', PATCHER.active)\n"
    "print('APPLIED', ','.join(PATCHER.applied()))\n"
)


def _probe(**env: str) -> tuple[str, str]:
    full = {
        k: v
        for k, v in os.environ.items()
        if k not in ("VLLM_PLUGINS", "SPECULATORS_HYBRID_DISABLE")
    }
    full.update(env, VLLM_LOGGING_LEVEL="INFO")
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=full, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("env", "armed"),
    [
        ({}, True),
        pytest.param({"VLLM_PLUGINS": "speculators_hybrid"}, True, marks=pytest.mark.full_tier),
        pytest.param({"VLLM_PLUGINS": "other"}, False, marks=pytest.mark.full_tier),
        pytest.param({"SPECULATORS_HYBRID_DISABLE": "1"}, False, marks=pytest.mark.full_tier),
    ],
)
def test_loader_switches(env, armed):
    out, log = _probe(**env)
    ids = ",".join(p.id for p in PATCHER.select(vllm_patches())) if armed else ""
    assert f"ARMED {armed}\n" in out
    assert f"APPLIED {ids}\n" in out  # every target of every selected patch, once imported
    if armed:
        assert "speculators-hybrid: pid=" in log and f"vllm={PATCHER.version_of('vllm')}" in log
