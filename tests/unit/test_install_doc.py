"""docs/install.md's CPU command installs a CPU-only vLLM: the lock it names pins the CPU
torch and holds no GPU-only package (the uv excludes of the test matrix, NVIDIA wheels)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_cpu_command_installs_a_cpu_lock_without_following_vllms_requirements():
    doc = (REPO / "docs" / "install.md").read_text()
    command = doc.split("## A CPU machine", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    assert "--no-deps" in command and " ." in command
    (lock,) = re.findall(r"-r (tests/requirements/locks/\S+\.txt)", command)
    pins = [
        line.split("==")[0].lower()
        for line in (REPO / lock).read_text().splitlines()
        if line and not line.startswith("#")
    ]
    torch = [line for line in (REPO / lock).read_text().splitlines() if line.startswith("torch==")]
    assert torch and torch[0].endswith("+cpu")
    excluded = {
        line.strip().lower()
        for line in (REPO / "tests/requirements/gpu-only.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert not excluded & set(pins)
    assert not [p for p in pins if p.startswith("nvidia-")]
    assert "vllm" in pins and "wrapt" in pins and "packaging" in pins  # ours, with --no-deps
