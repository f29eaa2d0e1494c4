"""benchmarks/runner_v2/proofs.sh's order of phases, with a stand-in for the staged Python.

The job runs on the GPU machine, where a phase that never returns costs the session's device
time; here each command it runs is answered by a small script ($PY): the GPU tests through
pytest, the benchmark's engines through extraction.py. Every phase must run, in order, from the
job's own copy of the code, each bounded by its timeout (a hung one is cut and the next runs),
and `poll` must bring back what is done.
"""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

JOB = Path(__file__).resolve().parents[2] / "benchmarks" / "runner_v2" / "proofs.sh"
ROOT = JOB.parents[2]

# answers `PY -m pytest ... FILE [-k EXPR]` and `PY benchmarks/extraction.py ...`
STANDIN = r"""#!/bin/bash
echo "$(pwd) | $* | report=${SPECULATORS_HYBRID_GPU_REPORT:-}" >> "$STUB/calls"
case "$*" in
  *"$HANG"*) exec sleep 30 ;;
  *"-m pytest"*) echo '{"cases": {}}' > "$SPECULATORS_HYBRID_GPU_REPORT"; echo "1 passed" ;;
  *compile_dir*) ;;  # stash.sh's STASH_COMPILE, before the phases
  *--table-only*) echo "| table |" ;;
  *extraction.py*) out=$(echo "$*" | sed 's/.*--out \([^ ]*\).*/\1/'); touch "$out/$3.json" ;;
  *) echo "stand-in: unexpected: $*" >&2; exit 9 ;;
esac
"""


def setup(tmp_path: Path, hang: str) -> dict[str, str]:
    stub = tmp_path / "stub"
    stub.mkdir()
    (stub / "py").write_text(STANDIN)
    (stub / "py").chmod(0o755)
    env = {**os.environ, "V2": str(tmp_path / "v2"), "PY": str(stub / "py"), "STUB": str(stub)}
    env |= {"HANG": hang, "MATCH_S": "2", "KV_S": "2", "FAMILIES_S": "2", "RATIO_S": "4"}
    env |= {"OUT": str(tmp_path / "out")}
    return env


def calls(tmp_path: Path) -> list[str]:
    return (tmp_path / "stub" / "calls").read_text().splitlines()


def test_every_phase_runs_in_order_and_a_hung_one_is_cut(tmp_path: Path) -> None:
    env = setup(tmp_path, hang="test_kv_capacity.py")
    v2 = tmp_path / "v2"
    (v2 / "code").mkdir(parents=True)
    (v2 / "logs").mkdir()
    (v2 / "results").mkdir()
    done = subprocess.run(
        ["bash", str(JOB), "all"], env=env, capture_output=True, text=True, timeout=60
    )
    status = (v2 / "status").read_text()
    assert done.returncode == 0, status + done.stderr
    assert "proofs: finished" in status and (v2 / "done").exists()
    compiled, *seen = calls(tmp_path)
    assert "compile_dir(" in compiled, compiled  # the staged packages, before any phase
    assert status.index("compiled in") < status.index("match: started")
    order = [
        "test_hidden_states_match.py",
        "test_kv_capacity.py",
        "test_hybrid_families.py -k prefix-off",
        "extraction.py --plugin on",
        "extraction.py --plugin off",
        "extraction.py --table-only",
        "test_hybrid_families.py -k prefix-on",
    ]
    assert len(seen) == len(order), seen
    for line, want in zip(seen, order, strict=True):
        assert want in line, (want, line)
        assert line.startswith(f"{v2}/code |"), line  # from the job's own copy
    assert "kv: exit 124 (timed out after 2 s)" in status
    for phase in ("match", "families-off", "ratio", "families-on"):
        assert f"{phase}: exit 0" in status, status
    assert f"report={v2}/results/match.json" in seen[0]
    assert "--size qwen3.6-27b" in seen[3] and "--cuda-graphs off" in seen[3]
    assert (v2 / "results" / "ratio" / "table.txt").read_text().strip() == "| table |"


def test_start_returns_and_poll_brings_back_the_results(tmp_path: Path) -> None:
    env = setup(tmp_path, hang="test_hidden_states_match.py") | {"PHASES": "match ratio"}
    env["MATCH_S"] = "6"  # match hangs until cut: the job is still running at the second start

    def job(*args: str, timeout: int = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(JOB), *args],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    started = job("start")
    assert started.returncode == 0, started.stderr
    assert "proofs started: match ratio" in started.stdout
    assert job("start").returncode == 3  # no second job over a running one
    polled = job("poll", "40", timeout=60)
    assert "proofs: all done" in polled.stdout, polled.stdout + polled.stderr
    assert "match: exit 124 (timed out after 6 s)" in polled.stdout
    assert "ratio: exit 0" in polled.stdout and "| table |" in polled.stdout
    with tarfile.open(tmp_path / "out" / "v2.tgz") as tar:
        names = tar.getnames()
    assert "results/ratio/table.txt" in names and "status" in names, names
    assert (tmp_path / "v2" / "code" / "tests" / "gpu" / "test_kv_capacity.py").exists()
