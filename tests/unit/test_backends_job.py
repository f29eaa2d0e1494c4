"""benchmarks/backends/backends.py's orchestration, with stand-ins for the staged environment.

The run is for the GPU machine, where a wait that never returns costs the session's device
time; here each command it runs is answered by a small script (RUNNER): the vLLM version, a
server per backend that answers /health and /v1/completions (logging each answer as vLLM's
server does) until stopped, `launch`'s one-line refusal of mooncake before vLLM 0.22,
prepare-data, a trainer that asks its server for every prepared sample, generate-offline-data.
Mooncake's master and store process are stand-ins too (a `mooncake` folder of two executables
that listen where they are told), started by the CPU tests' starter. The run must end on its
own, leave no server or store process behind, record a refusal, and stop a trainer that hangs.
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
JOB = ROOT / "benchmarks" / "backends" / "backends.py"
SCRIPT = ROOT / "benchmarks" / "backends" / "backends.sh"
STANDIN = Path(__file__).with_name("standin_vllm.py")  # each server's stand-in
PREPARED = 6

RUNNER = (
    standin_vllm.RUNNER_HEAD
    + r"""# answers the backends run's commands
ask() {  # URL N: N completions from the server
  python3 -c "
import urllib.request as u
for _ in range($2):
    u.urlopen(u.Request('$1/completions', data=b'{}'), timeout=5).read()"
}
echo "$args" >> "$STUB/commands"
case $args in
  *benchmarks/backends/backends.py*) exec "$@" ;;  # backends.sh's orchestrator, for real
  *"version('vllm')"*) echo "$VLLM" ;;
  *load_from_disk*) cat "$4/n" ;;
  *target.py*)
    mkdir -p "$3"; echo '{"heldout_loss": 1.0}' > "$3/target.json"
    for i in 1 2 3 4 5 6 7 8; do echo '{"conversations": []}'; done > "$3/chats.jsonl" ;;
  *"speculators_hybrid.cli launch"*)
    backend=$(value --hidden-states-backend "$@"); port=$(value --port "$@")
    master=$(value --mooncake-master "$@")
    echo "$$ $backend $master $MOONCAKE_LOCAL_HOSTNAME" >> "$STUB/servers"
    if [ "$backend" = mooncake ] && [ "$VLLM" = 0.20.1 ]; then
      echo "speculators-hybrid launch: error: --hidden-states-backend mooncake cannot" \
        "work on vLLM 0.20.1" >&2
      exit 2
    fi
    case " $args " in *" --dry-run "*) echo "Would run (--dry-run):"; exit 0 ;; esac
    mkdir -p "$(value --hidden-states-path "$@")"  # as the connector does
    exec python3 "$STANDIN" "$port" ;;
  *prepare-data*)
    out=$(value --output "$@"); mkdir -p "$out"; echo "$PREPARED" > "$out/n"
    echo "$(value --render-endpoint "$@")" > "$STUB/rendered-by" ;;
  *"speculators train"*)
    backend=$(value --hidden-states-backend "$@")
    echo "$backend $(value --mooncake-master "$@") $MOONCAKE_LOCAL_HOSTNAME" >> "$STUB/trainers"
    [ "$backend" = "${HANG:-}" ] && exec sleep 600
    ask "$(value --vllm-endpoint "$@")" "$PREPARED"
    for i in 1 2; do echo "{'global_step': $i}"; done ;;
  *generate-offline-data*)
    out=$(value --output "$@"); mkdir -p "$out"
    for i in 0 1 2 3; do head -c 1000 /dev/zero > "$out/hs_$i.safetensors"; done ;;
  *compileall*) ;;  # stash.sh's first step
  *) echo "stub: unexpected: $args" >&2; exit 9 ;;
esac
"""
)

LISTENER = r"""#!/usr/bin/env python3
# a stand-in for Mooncake's %s: listens on the port it is given until stopped
import os, socket, sys, time
port = next(int(a.split("=")[1]) for a in sys.argv if a.startswith("%s="))
with open(os.environ["STUB"] + "/store-pids", "a") as f:
    f.write(f"{os.getpid()}\n")
s = socket.socket(); s.bind(("127.0.0.1", port)); s.listen()
while True:
    time.sleep(1)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def alive(pid: str) -> bool:
    try:
        return "Z" not in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False


def setup(
    tmp_path: Path, vllm: str, hang: str, train_timeout: int, store: bool = True
) -> tuple[list[str], dict, int]:
    """The command, its environment and its first port, with the stand-ins in tmp_path/stub
    (without `store`, no `mooncake` package is found)."""
    work, stub, acc = tmp_path / "work", tmp_path / "stub", tmp_path / "acc"
    package = stub / "site" / "mooncake"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    for name, flag in (("mooncake_master", "-rpc_port"), ("mooncake_client", "-port")):
        (package / name).write_text(LISTENER % (name, flag))
        (package / name).chmod(0o755)
    runner = stub / "runner.sh"
    runner.write_text(RUNNER)
    env = {**os.environ, "RUNNER": str(runner), "STUB": str(stub), "VLLM": vllm}
    env |= {"PREPARED": str(PREPARED), "HANG": hang, "STANDIN": str(STANDIN)}
    env["PYTHONPATH"] = str(stub / ("site" if store else "none"))
    env.pop("MOONCAKE_LOCAL_HOSTNAME", None)
    port = free_port()
    cmd = [sys.executable, str(JOB), str(work), "--launcher", "launch_vllm.py", "--acc", str(acc)]
    cmd += ["--port", str(port), "--target-s", "1", "--train-timeout", str(train_timeout)]
    return [*cmd, "--poll", "0.2"], env, port


def left_running(stub: Path) -> list[str]:
    """The stand-in servers and store processes still alive, all then killed (a run that hangs
    leaves its processes: stopped here too)."""
    pids = [line.split()[0] for line in lines(stub / "servers")] + lines(stub / "store-pids")
    left = [pid for pid in pids if alive(pid)]
    for pid in pids:
        subprocess.run(["kill", "-9", pid], capture_output=True)
    return left


@pytest.mark.parametrize(
    ("vllm", "hang", "one_at_a_time", "store"),
    [
        ("0.25.0", "", "0", True),
        ("0.20.1", "", "0", True),
        ("0.25.0", "fp8", "0", True),
        ("0.20.1", "", "1", True),
        ("0.20.1", "", "0", False),  # Mooncake not staged: launch still asked (--dry-run)
        ("0.25.0", "", "1", False),
    ],
)
def test_every_backend_trained_or_recorded_and_nothing_left(
    tmp_path: Path, vllm: str, hang: str, one_at_a_time: str, store: bool
) -> None:
    work, stub = tmp_path / "work", tmp_path / "stub"
    # the hung trainer is stopped at the timeout; the others must finish within it on a busy host
    cmd, env, port = setup(tmp_path, vllm, hang, train_timeout=15, store=store)
    env["ONE_AT_A_TIME"] = one_at_a_time
    t0 = time.time()
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=90)
    finally:
        left = left_running(stub)
    assert not left, "the run left a server or store process running"
    assert (work / "backends.json").exists(), done.stdout + done.stderr
    assert time.time() - t0 < 60
    report = json.loads((work / "backends.json").read_text())
    results = report["results"]
    assert "prepare" in report, done.stdout + done.stderr
    assert report["vllm"] == vllm and report["prepare"]["samples"] == PREPARED
    assert set(results) == {"file", "fp8", "mooncake"}, done.stdout + done.stderr

    servers = {line.split()[1]: line.split()[2:] for line in lines(stub / "servers")}
    master = report["store"].get("master")
    assert (master is None) == (not store) and ("failed" in report["store"]) == (not store)
    advertised = [master, "127.0.0.1"] if master else ["127.0.0.1"]  # the launcher's: loopback
    assert servers["mooncake"] == advertised
    starts = [line.split()[1] for line in lines(stub / "servers")]  # one each, in turn or at once
    assert (starts if one_at_a_time == "1" else sorted(starts)) == ["file", "fp8", "mooncake"]
    commands = lines(stub / "commands")
    first_trainer = next(i for i, c in enumerate(commands) if "speculators train" in c)
    fp8_start = next(i for i, c in enumerate(commands) if "cli launch" in c and "backend fp8" in c)
    assert (fp8_start > first_trainer) == (one_at_a_time == "1")
    assert (stub / "rendered-by").read_text().strip() == f"http://127.0.0.1:{port}"
    if not store:  # the store's error, and what launch --dry-run said of the backend
        assert "not installed" in results["mooncake"]["store_failed"][0]
        dry = [c for c in lines(stub / "commands") if "cli launch" in c and "backend mooncake" in c]
        assert len(dry) == 1 and "--dry-run" in dry[0]
    if vllm == "0.20.1":  # launch's own line, recorded; no trainer for it
        assert results["mooncake"]["refused"].startswith("speculators-hybrid launch: error:")
        assert "train" not in results["mooncake"]
    elif not store:
        assert (
            results["mooncake"]["launch_dry_run_exit"] == 0 and "train" not in results["mooncake"]
        )
    else:
        mooncake = results["mooncake"]["train"]
        assert mooncake["rc"] == 0 and mooncake["no_sample_dropped"], mooncake
        trainers = {
            line.split()[0]: line.split()[1:]
            for line in (stub / "trainers").read_text().splitlines()
        }
        assert trainers["mooncake"] == [master, "127.0.0.1"]
    for name in ("file", "fp8"):
        trained = results[name]["train"]
        if name == hang:  # killed at its timeout, the run went on
            assert trained["rc"] == 124 and not trained["no_sample_dropped"]
            continue
        assert trained["rc"] == 0 and trained["answered"] == PREPARED, trained
        assert trained["no_sample_dropped"] and trained["hidden_state_files_left"] == 0
        assert trained["samples_per_s_with_startup"] > 0
        assert results[name]["on_disk"]["bytes_per_sample"] == 1000
    assert done.returncode == (1 if hang else 0), done.stdout + done.stderr


def test_a_sigterm_stops_every_server_and_the_store(tmp_path: Path) -> None:
    """The outer `timeout` of backends.sh sends SIGTERM: the run still stops what it started
    (each in its own session, so nothing else would) and writes its report."""
    work, stub = tmp_path / "work", tmp_path / "stub"
    cmd, env, _ = setup(tmp_path, "0.25.0", "file", train_timeout=60)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        end = time.time() + 30
        while not lines(stub / "trainers") and time.time() < end:
            time.sleep(0.1)
        assert lines(stub / "trainers"), "the first trainer never started"
        proc.terminate()
        proc.wait(30)
    finally:
        proc.kill()
        left = left_running(stub)
    assert proc.returncode == 143
    assert not left, "a SIGTERM left a server or store process running"
    report = json.loads((work / "backends.json").read_text())
    assert report["store"]["master"] and "seconds" in report


def test_backends_sh_starts_polls_and_checks(tmp_path: Path) -> None:
    """`backends.sh start` runs the job in the background from a copy of the code, `poll`
    waits for it and brings back its report; `check` says what Mooncake lacks (here: all)."""
    stub, bk, out = tmp_path / "stub", tmp_path / "bk", tmp_path / "out"
    cmd, env, port = setup(tmp_path, "0.20.1", "", train_timeout=15, store=False)
    env |= {"BK": str(bk), "OUT": str(out), "PORT": str(port), "TARGET_S": "1"}
    env["ACC"] = str(tmp_path / "acc")
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"  # its python3: this one
    try:
        check = subprocess.run(["bash", str(SCRIPT), "check"], cwd=ROOT, env=env,
                               capture_output=True, text=True, timeout=60)  # fmt: skip
        start = subprocess.run(["bash", str(SCRIPT), "start"], cwd=ROOT, env=env,
                               capture_output=True, text=True, timeout=60)  # fmt: skip
        poll = subprocess.run(["bash", str(SCRIPT), "poll", "60"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=90)  # fmt: skip
    finally:
        left = left_running(stub)
    assert check.returncode == 1 and "mooncake: not installed" in check.stdout, check.stdout
    assert start.returncode == 0, start.stderr
    assert "finished: exit 0" in poll.stdout, poll.stdout + (bk / "backends.log").read_text()
    assert not left, "the run left a server running"
    assert (bk / "code" / "benchmarks" / "backends" / "backends.py").exists()  # ran from a copy
    commands = lines(stub / "commands")  # the staged packages compiled once, before any server
    compiled = [i for i, c in enumerate(commands) if "compile_dir(" in c]
    assert len(compiled) == 1 and compiled[0] < next(
        i for i, c in enumerate(commands) if "cli launch" in c
    ), commands
    listing = subprocess.run(["tar", "tzf", str(out / "backends.tgz")], capture_output=True,
                             text=True, check=True).stdout.split()  # fmt: skip
    assert "work/backends.json" in listing and "backends.log" in listing
    report = json.loads((bk / "work" / "backends.json").read_text())
    assert report["results"]["mooncake"]["refused"].startswith("speculators-hybrid launch: error:")
