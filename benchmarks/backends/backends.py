"""speculators' hidden-state backends with a real trainer on one GPU: the same EAGLE-3 trained
online once per `--hidden-states-backend`, samples/s and dropped samples side by side.

    python benchmarks/backends/backends.py WORK --launcher launch_vllm.py [--acc ACC] ...

In WORK, each phase bounded by a timeout and run in its own process group, each command through
`$RUNNER run` (the staged environment; plain when RUNNER is unset):

1. the target: ACC/target when the acceptance loop made one, else `target.py` for TARGET_S s;
2. with `mooncake` among BACKENDS, a Mooncake master and store process on loopback (the CPU
   tests' starter, tests/cpu/mooncake_store.py; libibverbs linked from the pyverbs wheel);
3. one `speculators-hybrid launch --hidden-states-backend B` per backend, all started together
   (PORT, PORT+1, ...): a start refused by `launch` (mooncake before vLLM 0.22) is recorded with
   its one line; the others wait, idle, for their turn;
4. `speculators prepare-data` once, through the first ready server (--render-endpoint);
5. for each ready backend in turn, alone: the trainer (`speculators-hybrid run -- speculators
   train --on-missing generate --hidden-states-backend B`, loop.sh's EAGLE-3 flags, EPOCHS
   epochs of at most STEPS steps), polled every 2 s for the server's answered requests; for
   `file` and `fp8` then `generate-offline-data` of the first --sizes samples (bytes a sample on
   disk; the files deleted after); then its server stopped;
6. `backends.json`, rewritten after every phase; a SIGTERM (the outer timeout) still stops every
   server and the store and writes it.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.seed_job.seed import (  # noqa: E402
    Poller,
    runner,
    steady_rate,
    stop,
    timed,
    wait_ready,
)

LOOPBACK = "127.0.0.1"
REFUSED = "speculators-hybrid launch: error:"  # launch's one line (launch.main)
# speculators' GenerationRecoveryGuard: every failed round trip, and the ones that gave up
RETRY = "Hidden-state round trip failed"
GAVE_UP = "consecutive failures="
SERVER_ERROR = re.compile(r"\bERROR\b|Traceback|Exception")
LAYER_IDS = ["2", "4", "5"]  # the stdlib-tiny target's, as loop.sh trains


def say(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} backends: {message}", flush=True)


@functools.cache
def store_module() -> Any:
    """tests/cpu/mooncake_store.py: the one way this project starts a Mooncake store."""
    path = ROOT / "tests" / "cpu" / "mooncake_store.py"
    spec = importlib.util.spec_from_file_location("mooncake_store", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["mooncake_store"] = module  # its dataclass looks itself up there
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def output(cmd: list[str], timeout: float = 120) -> str:
    """The last line a quick command prints ("" if it fails)."""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    lines = done.stdout.strip().splitlines()
    return lines[-1].strip() if done.returncode == 0 and lines else ""


def py(code: str, *args: str) -> list[str]:
    return [*runner(), sys.executable, "-c", code, *args]


def tail(path: Path, lines: int = 3) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return []


def lines_with(path: Path, *needles: str) -> list[str]:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if all(n in line for n in needles)]


class Server:
    """One `speculators-hybrid launch` in its own process group."""

    def __init__(
        self, a: argparse.Namespace, backend: str, port: int, extra: list[str], dry: bool = False
    ) -> None:
        self.backend, self.port = backend, port
        self.log = a.work / "logs" / f"server-{backend}.log"
        self.hs = a.work / f"hs-{backend}"
        shutil.rmtree(self.hs, ignore_errors=True)
        cmd = [
            *runner(), sys.executable, "-m", "speculators_hybrid.cli", "launch",
            *(["--dry-run"] if dry else []), "--launcher", str(a.launcher), str(a.target),
            "--hidden-states-path", str(self.hs),
            "--hidden-states-backend", backend, *extra, "--",
            f"--port={port}", "--max-model-len=1024", "--max-num-seqs=64",
            "--max-num-batched-tokens=8192", f"--kv-cache-memory-bytes={4 << 30}",
            f"--gpu-memory-utilization={a.gpu_memory_utilization}",
            "--gdn-prefill-backend=triton", "--enforce-eager",
        ]  # fmt: skip
        with self.log.open("w") as f:
            self.proc = subprocess.Popen(
                cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.started = time.time()
        (a.work / f"server-{backend}.pid").write_text(str(self.proc.pid))

    @property
    def endpoint(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def ready(self, until: float) -> bool:
        return wait_ready(self.proc, self.port, max(until - time.time(), 0))

    def stop(self) -> int | None:
        """SIGTERM to its group, SIGKILL after 15 s; its exit code."""
        return stop(self.proc, grace=15)

    def errors(self) -> dict[str, Any]:
        found = [line for line in tail(self.log, 100_000) if SERVER_ERROR.search(line)]
        return {"error_lines": len(found), "last_errors": found[-3:]}


def native_libraries(work: Path) -> None:
    """LD_LIBRARY_PATH for Mooncake's binaries and `mooncake.store` (here and in every process
    started after): libibverbs.so.1, which its wheels omit, linked from the pyverbs wheel when
    it is installed, and the folders in MOONCAKE_LIBS (system libraries the image lacks)."""
    store = store_module()
    paths = os.environ.get("MOONCAKE_LIBS", "").split(":")
    pyverbs = store.package_dir("pyverbs")
    if pyverbs is not None:
        store.link_libibverbs(work / "ibverbs")
        paths += [str(work / "ibverbs"), str(pyverbs.parent / "pyverbs.libs")]
    now = [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p]
    os.environ["LD_LIBRARY_PATH"] = ":".join([p for p in paths if p and p not in now] + now)


def missing_libraries(work: Path) -> list[str]:
    """What the dynamic loader cannot find for Mooncake's master, store process and Python
    module, as the run would load them (`ldd`); ["mooncake: not installed"] without it."""
    native_libraries(work)
    folder = store_module().package_dir("mooncake")
    if folder is None:
        return ["mooncake: not installed"]
    missing = []
    for name in ("mooncake_master", "mooncake_client", "store.so"):
        try:
            done = subprocess.run(
                ["ldd", str(folder / name)], capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            missing.append(f"{name}: {exc}")
            continue
        lines = (done.stdout + done.stderr).splitlines()
        missing += [f"{name}: {line.split()[0]}" for line in lines if "not found" in line]
    return list(dict.fromkeys(missing))


def start_store(a: argparse.Namespace, stack: ExitStack, report: dict[str, Any]) -> str | None:
    """The Mooncake master and store process (stopped by `stack`); the master's address, or
    None with the reason in the report."""
    store = store_module()
    native_libraries(a.work)
    logs = a.work / "logs" / "mooncake"
    logs.mkdir(parents=True, exist_ok=True)
    try:
        running = stack.enter_context(store.running_store(logs, a.store_segment))
    except Exception as exc:  # noqa: BLE001 - recorded: the backend's result is its failure
        report["store"] = {"failed": str(exc).splitlines()[:6]}
        report["store"]["missing_libraries"] = missing_libraries(a.work)
        return None
    report["store"] = {"master": running.master, "segment": a.store_segment}
    (a.work / "store.pids").write_text(" ".join(str(p.pid) for p in running.processes))
    return str(running.master)


def train_cmd(a: argparse.Namespace, server: Server, extra: list[str]) -> list[str]:
    """loop.sh's EAGLE-3 (train_one), online from `server`, through its backend."""
    save = a.work / f"train-{server.backend}"
    steps = ["--max-steps", str(a.steps)] if a.steps else []
    return [
        *runner(), sys.executable, "-m", "speculators_hybrid.cli", "run", "--",
        sys.executable, "-m", "speculators", "train", "--speculator-type", "eagle3",
        "--verifier-name-or-path", str(a.target), "--data-path", str(a.work / "data"),
        "--save-path", str(save), "--log-dir", str(save / "logs"),
        "--on-missing", "generate", "--vllm-endpoint", f"{server.endpoint}/v1",
        "--hidden-states-backend", server.backend, *extra,
        "--target-layer-ids", *LAYER_IDS, "--total-seq-len", "4096", "--seed", "0",
        *steps, "--epochs", str(a.epochs), "--lr", "1e-3", "--scheduler-type", "cosine",
        "--scheduler-warmup-steps", "50", "--train-data-ratio", "0.98", "--num-workers", "4",
        "--log-freq", "10", "--num-layers", "1",
    ]  # fmt: skip


def train(a: argparse.Namespace, server: Server, extra: list[str], prepared: int) -> dict:
    """The trainer alone against `server`: exit, time, samples/s, and whether every prepared
    sample reached it."""
    log = a.work / "logs" / f"train-{server.backend}.log"
    shutil.rmtree(a.work / f"train-{server.backend}", ignore_errors=True)
    env = {**os.environ, "TORCHDYNAMO_DISABLE": "1", "MOONCAKE_LOCAL_HOSTNAME": LOOPBACK}
    poller = Poller(server.log, a.poll, a.work / "logs" / f"poll-{server.backend}.jsonl")
    before = poller.answered()
    poller.trainer_log = log
    poller.groups["server"] = server.proc.pid
    poller.start()
    try:
        run = timed(train_cmd(a, server, extra), log, a.train_timeout, env,
                    started=lambda pid: poller.groups.update(trainer=pid))  # fmt: skip
    finally:
        poller.stop()
    points = [(t, n - before) for t, n in poller.points]
    answered = points[-1][1] if points else 0
    retries, gave_up = len(lines_with(log, RETRY)), len(lines_with(log, RETRY, GAVE_UP))
    text = log.read_text(errors="replace") if log.exists() else ""
    files_left = len(list(server.hs.glob("*.safetensors"))) if server.hs.is_dir() else None
    whole = round(answered / run["seconds"], 3) if run["seconds"] else None
    return {
        **run, "steps_logged": text.count("global_step"), "answered": answered,
        "samples_per_s": steady_rate(points),
        "samples_per_s_with_startup": whole,
        "round_trip_retries": retries, "samples_given_up": gave_up,
        "hidden_state_files_left": files_left, "prepared": prepared,
        # the whole epoch(s) asked for, each sample once, none given up
        "no_sample_dropped": run["rc"] == 0 and gave_up == 0
        and answered - retries >= prepared * a.epochs,
        "last_lines": text.splitlines()[-3:],
    }  # fmt: skip


def sizes(a: argparse.Namespace, server: Server) -> dict[str, Any]:
    """Bytes on disk a sample: the server writes the first `--sizes` samples' files, kept by
    speculators' generate-offline-data; deleted after."""
    out = a.work / f"sizes-{server.backend}"
    shutil.rmtree(out, ignore_errors=True)
    cmd = [*runner(), sys.executable, "-m", "speculators", "generate-offline-data",
           "--endpoint", f"{server.endpoint}/v1", "--preprocessed-data", str(a.work / "data"),
           "--output", str(out), "--max-samples", str(a.sizes), "--concurrency", "8"]  # fmt: skip
    run = timed(cmd, a.work / "logs" / f"sizes-{server.backend}.log", 90)
    files = sorted(out.glob("hs_*.safetensors")) if out.is_dir() else []
    total = sum(f.stat().st_size for f in files)
    shutil.rmtree(out, ignore_errors=True)
    return {**run, "files": len(files), "bytes_per_sample": total // len(files) if files else None}


def prepare(a: argparse.Namespace, server: Server, report: dict[str, Any]) -> int:
    """prepare-data through `server` once; the number of samples prepared (0: failed)."""
    with (a.target / "chats.jsonl").open() as f, (a.work / "chats.jsonl").open("w") as g:
        g.writelines(line for _, line in zip(range(a.chats), f, strict=False))
    shutil.rmtree(a.work / "data", ignore_errors=True)
    cmd = [*runner(), sys.executable, "-m", "speculators", "prepare-data",
           "--model", str(a.target), "--data", str(a.work / "chats.jsonl"),
           "--output", str(a.work / "data"), "--seq-length", "512",
           "--render-endpoint", server.endpoint,
           "--num-preprocessing-workers", "8"]  # fmt: skip
    report["prepare"] = timed(cmd, a.work / "logs" / "prepare-data.log", a.prepare_timeout)
    count = "import datasets, sys; print(len(datasets.load_from_disk(sys.argv[1])))"
    rows = output(py(count, str(a.work / "data")))
    prepared = int(rows) if rows.isdigit() and report["prepare"]["rc"] == 0 else 0
    report["prepare"].update(through=server.backend, samples=prepared)
    return prepared


def make_target(a: argparse.Namespace, report: dict[str, Any]) -> bool:
    if a.acc and (a.acc / "target" / "target.json").exists():
        a.target = a.acc / "target"
        report["target"] = {"reused": str(a.target)}
        return True
    a.target = a.work / "target"
    if not (a.target / "target.json").exists():
        say(f"target: training {a.target_s} s")
        cmd = [*runner(), sys.executable, str(ROOT / "benchmarks" / "acceptance" / "target.py"),
               str(a.target), "--seconds", str(a.target_s)]  # fmt: skip
        report["target"] = timed(cmd, a.work / "logs" / "target.log", a.target_s + 240)
    return (a.target / "target.json").exists()


def without_store(a: argparse.Namespace, port: int, failed: list[str]) -> dict[str, Any]:
    """No Mooncake store: `launch --dry-run` only tells whether it refuses the backend."""
    server = Server(a, "mooncake", port, [], dry=True)
    try:
        server.proc.wait(120)
    except subprocess.TimeoutExpired:
        pass
    exit_code = server.stop()
    refused = lines_with(server.log, REFUSED)
    said = {"refused": refused[-1]} if refused else {"launch_dry_run_exit": exit_code}
    return {"store_failed": failed, **said}


def turn(a: argparse.Namespace, server: Server, extra: list[str], prepared: int) -> dict:
    """One backend's turn, its server ready and alone at work: the trainer, bytes on disk."""
    say(f"train {server.backend}")
    result: dict[str, Any] = {"train": train(a, server, extra, prepared)}
    if server.backend in ("file", "fp8") and a.sizes:
        result["on_disk"] = sizes(a, server)
    result["server_exit"] = server.stop()
    result["server"] = server.errors()
    say(f"train {server.backend}: exit {result['train']['rc']}")
    return result


def each_backend(
    a: argparse.Namespace, report: dict, extra: dict[str, list[str]], servers: dict[str, Server]
) -> None:
    """Every server started at once (unless --one-at-a-time), then each backend in turn: its
    server ready or its refusal recorded, prepare-data through the first ready one, its turn."""
    results = report["results"]
    todo = [(b, a.port + i) for i, b in enumerate(a.backends)]
    no_store = "failed" in report.get("store", {})

    def start(b: str, port: int) -> Server:
        if b not in servers:
            servers[b] = Server(a, b, port, extra[b])
        return servers[b]

    if not a.one_at_a_time:
        for b, port in todo:
            if b != "mooncake" or not no_store:
                start(b, port)
    prepared = 0
    for b, port in todo:
        if b == "mooncake" and no_store:
            results[b] = without_store(a, port, report["store"]["failed"])
            continue
        server = start(b, port)
        say(f"server {b}: waiting")
        if not server.ready(server.started + a.server_timeout):
            refused = lines_with(server.log, REFUSED)
            results[b] = {"refused": refused[-1]} if refused else {
                "server_failed": tail(server.log, 5)}  # fmt: skip
            results[b]["server_exit"] = server.stop()
            say(f"server {b}: {'refused' if refused else 'FAILED'}")
            continue
        if not prepared:
            prepared = prepare(a, server, report)
            if not prepared:
                say("prepare-data: FAILED")
                return
        results[b] = turn(a, server, extra[b], prepared)
        (a.work / "backends.json").write_text(json.dumps(report, indent=2))


def run_all(a: argparse.Namespace) -> dict[str, Any]:
    a.work.mkdir(parents=True, exist_ok=True)
    (a.work / "logs").mkdir(exist_ok=True)
    t0 = time.time()
    report: dict[str, Any] = {"backends_asked": a.backends, "results": {}}
    version = "import importlib.metadata as m; print(m.version('vllm'))"
    report["vllm"] = output(py(version)) or None
    save = lambda: (a.work / "backends.json").write_text(json.dumps(report, indent=2))  # noqa: E731
    servers: dict[str, Server] = {}
    try:
        with ExitStack() as stack:
            if not make_target(a, report):
                report["failed"] = "no target"
                return report
            extra: dict[str, list[str]] = {b: [] for b in a.backends}
            if "mooncake" in a.backends:
                say("mooncake: starting the master and store")
                master = start_store(a, stack, report)
                if (
                    master is not None
                ):  # producer and consumer hold no segment: objects live in the store's
                    extra["mooncake"] = ["--mooncake-master", master,
                                         "--mooncake-global-segment-gib", "0",
                                         "--mooncake-local-buffer-gib", "0"]  # fmt: skip
            os.environ["MOONCAKE_LOCAL_HOSTNAME"] = LOOPBACK  # the launcher's advertised host
            each_backend(a, report, extra, servers)
    finally:
        for server in servers.values():
            server.stop()
        report["seconds"] = round(time.time() - t0, 1)
        save()
    return report


def parse(argv: list[str] | None) -> argparse.Namespace:
    env = os.environ.get
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("work", type=Path)
    p.add_argument("--launcher", type=Path, help="speculators' launch_vllm.py (required to run)")
    p.add_argument("--check", action="store_true",
                   help="only list the libraries Mooncake lacks here, then exit")  # fmt: skip
    p.add_argument("--acc", type=Path, default=Path(env("ACC", "/tmp/stash/acc")),
                   help="the acceptance loop's folder: its target is reused")  # fmt: skip
    p.add_argument("--backends", nargs="+", default=env("BACKENDS", "file fp8 mooncake").split())
    p.add_argument("--target-s", type=int, default=int(env("TARGET_S", "30")))
    p.add_argument("--chats", type=int, default=int(env("CHATS", "500")))
    p.add_argument("--steps", type=int, default=int(env("STEPS", "0")), help="0: no limit")
    p.add_argument("--epochs", type=int, default=int(env("EPOCHS", "1")))
    p.add_argument("--port", type=int, default=int(env("PORT", "8200")))
    p.add_argument("--sizes", type=int, default=32, help="samples written to measure bytes")
    p.add_argument("--store-segment", default="2 GB", help="the Mooncake store's memory")
    p.add_argument("--one-at-a-time", action="store_true",
                   default=env("ONE_AT_A_TIME", "0") == "1",
                   help="start each server at its turn, not all at once")  # fmt: skip
    p.add_argument("--gpu-memory-utilization", type=float, default=0.25)
    p.add_argument("--poll", type=float, default=2.0)
    p.add_argument("--server-timeout", type=float, default=330)
    p.add_argument("--prepare-timeout", type=float, default=180)
    p.add_argument("--train-timeout", type=float, default=240)
    args = p.parse_args(argv)
    if args.launcher is None and not args.check:
        p.error("--launcher PATH (speculators' scripts/launch_vllm.py) is required")
    unknown = set(args.backends) - {"file", "fp8", "mooncake"}
    if unknown:
        p.error(f"unknown backend {' '.join(sorted(unknown))}: choose from file fp8 mooncake")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.check:
        args.work.mkdir(parents=True, exist_ok=True)
        missing = missing_libraries(args.work)
        print("\n".join(missing) or "mooncake: every library found")
        return 1 if missing else 0
    # a timeout's SIGTERM unwinds through the `finally`s: servers and store stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    report = run_all(args)
    trained = [r["train"]["rc"] == 0 for r in report["results"].values() if "train" in r]
    print("backends:", json.dumps({b: sorted(r) for b, r in report["results"].items()}))
    return 0 if trained and all(trained) else 1


if __name__ == "__main__":
    raise SystemExit(main())
