"""vLLM's own plugin loader arms our patches, honouring VLLM_PLUGINS and our off switch."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import PATCHER, vllm_patches

PROBE = (
    "from speculators_hybrid import cpu; cpu.prepare()\n"
    "from vllm.plugins import load_general_plugins; load_general_plugins()\n"
    "from speculators_hybrid.plugin import PATCHER\n"
    "import vllm.v1.core.kv_cache_utils as k\n"
    "print('ARMED', PATCHER.active, ','.join(p.id for p in PATCHER.selected))\n"
    "print('PATCHED', hasattr(k.get_kv_cache_groups, '__wrapped__'))\n"
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
        ({"VLLM_PLUGINS": "speculators_hybrid"}, True),
        ({"VLLM_PLUGINS": "other"}, False),
        ({"SPECULATORS_HYBRID_DISABLE": "1"}, False),
    ],
)
def test_loader_switches(env, armed):
    out, log = _probe(**env)
    assert f"ARMED {armed}" in out
    # get_kv_cache_groups is patched only where a selected patch targets it
    patched = armed and any(
        t.attr == "get_kv_cache_groups" for p in PATCHER.select(vllm_patches()) for t in p.targets
    )
    assert f"PATCHED {patched}" in out
    if armed:
        ids = ",".join(p.id for p in PATCHER.select(vllm_patches()))
        assert f"ARMED True {ids}\n" in out
        assert "speculators-hybrid: pid=" in log and f"vllm={PATCHER.version_of('vllm')}" in log
