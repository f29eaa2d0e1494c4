"""benchmarks/seed_job/seed.py's orchestration, with a stand-in for the staged environment.

The seed job runs on the GPU machine, where a wait that never returns costs the session's device
time; here every command it runs is answered by a small script (RUNNER): a server that answers
/health and /v1/completions (logging each answer as vLLM's server does) until it is stopped,
prepare-data, generate-offline-data and a trainer that each ask the server for samples, the
first trainer running out of memory. nvidia-smi is a stand-in too (NVIDIA_SMI). The job must
end on its own, stop its server, retry the trainer with fewer anchors after the out-of-memory,
and derive samples/s and hours per epoch from the server's answers.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import standin_vllm

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.seed_job.seed import EPOCH_SAMPLES, hours_per_epoch, layer_ids, steady_rate  # noqa: E402

SEED = ROOT / "benchmarks" / "seed_job" / "seed.py"
STANDIN = Path(__file__).with_name("standin_vllm.py")  # the server's stand-in

RUNNER = (
    standin_vllm.RUNNER_HEAD
    + r"""# answers the seed job's commands
ask() {  # N SLEEP: N completions from the server
  python3 -c "
import sys, time, urllib.request as u
for _ in range($1):
    u.urlopen(u.Request('http://127.0.0.1:$PORT/v1/completions', data=b'{}'), timeout=5).read()
    time.sleep($2)"
}
echo "$args" >> "$STUB/commands"
case $args in
  *"speculators_hybrid.cli launch"*)
    echo "$$" >> "$STUB/pids-server"
    exec python3 "$STANDIN" "$PORT" ;;
  *prepare-data*)  # the number of samples, for generate-offline-data
    out=$(value --output "$@"); mkdir -p "$out"; wc -l < "$(value --data "$@")" > "$out/n" ;;
  *generate-offline-data*)
    mkdir -p "$(value --output "$@")"; ask "$(cat "$(value --preprocessed-data "$@")/n")" 0.01 ;;
  *"speculators train"*"--on-missing raise"*)  # alone, from the offline files
    echo "$$" >> "$STUB/pids-trainer"
    [ -d "$(value --hidden-states-path "$@")" ] || { echo "stub: no offline files" >&2; exit 1; }
    [ "$(cat "$(value --data-path "$@")/n")" = 8 ] || { echo "stub: not 8 samples" >&2; exit 1; }
    python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$PORT/health', timeout=1)" \
      2>/dev/null && echo "server still up" >> "$STUB/alone"
    for i in 1 2 3 4; do echo "{'global_step': $i}"; sleep 0.1; done ;;
  *"speculators train"*)
    echo "$$" >> "$STUB/pids-trainer"
    [ -n "${HANG:-}" ] && exec sleep 300
    if [ "$(value --max-anchors "$@")" = 512 ]; then
      ask 3 0.05
      echo "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 GiB"; exit 1
    fi
    for i in 1 2 3; do echo "{'global_step': $i}"; done
    ask 30 0.05 ;;
  *) echo "stub: unexpected: $args" >&2; exit 9 ;;
esac
"""
)

NVIDIA_SMI = r"""#!/bin/bash
# a stand-in nvidia-smi: the server 60,000 MiB and 70 % SM, the trainer 70,000 MiB and 20 %
pids() { cat "$STUB/pids-$1" 2>/dev/null | tail -n 1; }
up() { [ -n "$(pids "$1")" ] && kill -0 "$(pids "$1")" 2>/dev/null; }
case "$*" in
  *query-gpu*) echo 131000 ;;
  *query-compute-apps*)
    up server && echo "$(pids server), 60000"
    up trainer && echo "$(pids trainer), 70000" ;;
  pmon*)
    echo "# gpu pid type sm mem enc dec command"
    up server && echo "    0 $(pids server) C 70 30 - - python3"
    up trainer && echo "    0 $(pids trainer) C 20 5 - - python3" ;;
esac
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_steady_rate_and_hours_per_epoch() -> None:
    # 20 samples of warm-up, then 100 samples every 10 s: 10 samples/s
    points = [(0.0, 0), (10.0, 20), (20.0, 120), (30.0, 220), (35.0, 220)]
    assert steady_rate(points, warm=0.4) == pytest.approx(10.0)
    assert hours_per_epoch(10.0) == round(EPOCH_SAMPLES / 10 / 3600, 2) == 25.38
    assert steady_rate([(0.0, 0), (5.0, 0)]) is None and hours_per_epoch(None) is None


def test_layer_ids_are_speculators_defaults() -> None:
    assert layer_ids("qwen3.6-27b") == [2, 32, 61]  # the launcher adds 64
    assert layer_ids("tiny") == [2, 4, 5]


def stage(tmp_path: Path) -> tuple[Path, Path, dict[str, str], list[str]]:
    """The work folder with its inputs made, the stand-ins, their environment, the command."""
    work, stub = tmp_path / "work", tmp_path / "stub"
    (work / "verifier").mkdir(parents=True)
    stub.mkdir()
    # inputs already made (verifier.py's own test makes them): the job must not rebuild them
    (work / "verifier" / "model.safetensors.index.json").write_text("{}")
    (work / "chats.jsonl").write_text('{"conversations": []}\n' * 10)
    (work / "chats.json").write_text(json.dumps({"mean": 1500.0}))
    for name, text in (("runner.sh", RUNNER), ("nvidia-smi", NVIDIA_SMI)):
        (stub / name).write_text(text)
        (stub / name).chmod(0o755)
    port = free_port()
    env = {**os.environ, "RUNNER": str(stub / "runner.sh"), "STUB": str(stub), "PORT": str(port)}
    env["STANDIN"] = str(STANDIN)
    env["NVIDIA_SMI"] = str(stub / "nvidia-smi")
    args = [sys.executable, str(SEED), str(work), "--launcher", "launch_vllm.py", "--preset",
            "tiny", "--port", str(port), "--poll", "0.2", "--offline-samples", "8",
            "--steps", "3", "--server-timeout", "20", "--train-timeout", "30"]  # fmt: skip
    return work, stub, env, args


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_stopped_job_stops_its_server_and_trainer(tmp_path: Path) -> None:
    work, stub, env, args = stage(tmp_path)
    job = subprocess.Popen(args, env={**env, "HANG": "1"}, stdout=subprocess.PIPE, text=True)
    try:
        for _ in range(200):  # until the trainer runs
            if (stub / "pids-trainer").exists():
                break
            time.sleep(0.1)
        time.sleep(0.5)
        job.terminate()  # what `timeout` sends
        assert job.wait(40) == 143
    finally:
        job.kill()
        pids = [int((stub / f"pids-{n}").read_text().split()[-1]) for n in ("server", "trainer")]
        running = [p for p in pids if alive(p)]
        for pid in pids:
            subprocess.run(["kill", "-9", "--", f"-{pid}"], capture_output=True)
    assert not running, "a stopped job left its server or trainer running"
    assert "server_ready_s" in json.loads((work / "seed.json").read_text())


def test_seed_job_ends_stops_its_server_and_measures(tmp_path: Path) -> None:
    work, stub, env, args = stage(tmp_path)
    port = env["PORT"]
    try:
        done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=90)
    finally:  # a job that hangs leaves its server: stop it here too
        server = int((stub / "pids-server").read_text().split()[-1])
        left_running = Path(f"/proc/{server}/cmdline").exists()
        subprocess.run(["kill", "--", f"-{server}"], capture_output=True)
    report = json.loads((work / "seed.json").read_text())
    assert done.returncode == 0, done.stdout + done.stderr
    assert not left_running, "the seed job left its server running"

    commands = (stub / "commands").read_text().splitlines()
    launch = next(c for c in commands if "cli launch" in c)
    for flag in ("--launcher launch_vllm.py", "--load-format=dummy", "--enforce-eager",
                 f"--kv-cache-memory-bytes={10 << 30}", "--max-model-len=2049"):  # fmt: skip
        assert flag in launch, launch
    assert "--seq-length 2048" in next(c for c in commands if "prepare-data" in c)
    trainers = [c for c in commands if "speculators train" in c and "on-missing raise" not in c]
    assert [c.split("--max-anchors ")[1].split()[0] for c in trainers] == ["512", "256"]
    for flag in ("--speculator-type dflash", "--on-missing generate", "--target-layer-ids 2 4 5",
                 f"--vllm-endpoint http://127.0.0.1:{port}/v1", "cli run --"):  # fmt: skip
        assert flag in trainers[-1], trainers[-1]

    first, second = report["trainer"]
    assert first["out_of_memory"] and first["rc"] == 1 and not second["out_of_memory"]
    assert second["rc"] == 0 and second["steps_logged"] == 3 and second["samples"] == 30
    loop = report["loop"]
    assert 3 < loop["samples_per_s"] < 25, loop  # 30 answers about 0.05 s apart
    assert loop["hours_per_epoch"] == hours_per_epoch(loop["samples_per_s"])
    assert loop["tokens_per_s"] == round(loop["samples_per_s"] * 1500.0, 1)
    server_alone = report["server_alone"]
    assert server_alone["samples"] == 8 and server_alone["samples_per_s"] > 0
    assert loop["vs_server_alone"] == round(
        loop["samples_per_s"] / server_alone["samples_per_s"], 3
    )
    alone = report["trainer_alone"]  # from the yardstick's files, the server stopped first
    assert alone["rc"] == 0 and alone["max_anchors"] == 256 and alone["steps_logged"] == 4
    assert f"--hidden-states-path {work}/offline-hs" in commands[-1], commands[-1]
    assert f"--data-path {work}/data-alone" in commands[-1], commands[-1]
    assert not (stub / "alone").exists(), "the trainer alone ran beside the server"
    assert alone["gpu_peak_mib"] == {"total_mib": 131000, "trainer_mib": 70000}
    assert not (work / "offline-hs").exists()  # the yardstick's files deleted at the end
    assert report["gpu_peak_mib"] == {
        "server_mib": 60000,
        "total_mib": 131000,
        "trainer_mib": 70000,
    }
    assert report["server_sm_share"] == pytest.approx(70 / 90, abs=0.001)
    assert report["answered"] == 8 + 3 + 30
