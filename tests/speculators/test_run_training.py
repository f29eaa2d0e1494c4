"""`speculators-hybrid run` carries the patches into a real speculators process tree:
the command and the workers torchrun starts, each with the installed speculators."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

WORKER = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, {tests!r})
    from tiny_models import build
    model = build("eagle3", sys.argv[1])
    rank = os.environ.get("RANK", "-")
    with open(f"rank-{{rank}}.txt", "w") as out:  # a file each: workers share one stdout
        out.write(f"rank={{rank}} norm={{type(model.verifier_norm).__name__}}")
    """
)


def launch(tmp_path: Path, verifier: str, *cmd: str) -> subprocess.CompletedProcess:
    script = tmp_path / "worker.py"
    script.write_text(WORKER.format(tests=str(Path(__file__).parent)))
    return subprocess.run(
        [sys.executable, "-m", "speculators_hybrid.run", "--", *cmd, str(script), verifier],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        cwd=tmp_path,
    )


def seen(folder: Path) -> list[str]:
    return [path.read_text() for path in sorted(folder.glob("rank-*.txt"))]


def test_the_command_itself_is_patched(tmp_path, verifiers):
    path, _ = verifiers("qwen3_5_moe")
    done = launch(tmp_path, path, sys.executable)
    assert done.returncode == 0, done.stderr[-3000:]
    assert seen(tmp_path) == ["rank=- norm=OnePlusWeightRMSNorm"]


def test_torchrun_workers_are_patched(tmp_path, verifiers):
    path, _ = verifiers("qwen3_next")
    done = launch(
        tmp_path,
        path,
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    norm = "norm=OnePlusWeightRMSNorm"
    assert seen(tmp_path) == [f"rank=0 {norm}", f"rank=1 {norm}"]
    # one line per worker (counted, not split: two workers' lines can interleave on stderr);
    # the torchrun launcher never imports speculators
    assert done.stderr.count("patches=verifier-norm-eagle3") == 2
