"""The seed job on one GPU: vLLM + plugin serving the target and speculators training DFlash
online beside it, measured.

    python benchmarks/seed_job/seed.py WORK --launcher launch_vllm.py [--preset qwen3.6-27b] ...

In WORK, each phase bounded by a timeout, each command run through `$RUNNER run` (the staged
environment; plain when RUNNER is unset):

1. `verifier/`: config, tokenizer + chat template, the trainer's tensors (verifier.py);
   `chats.jsonl`: `--chats` chats of `--min-tokens`..`--max-tokens` tokens (uniform);
2. `speculators-hybrid launch` of the target with dummy weights (prefill-only, plugin on) and
   its own process group;
3. `speculators prepare-data` through the server;
4. the server alone: the first `--offline-samples` chats prepared on their own (`data-alone`)
   and `speculators generate-offline-data` of them (files deleted at the end), its rate the
   loop's yardstick;
5. `speculators-hybrid run -- speculators train --speculator-type dflash --on-missing generate`
   for `--steps` steps, again with fewer `--anchors` while it runs out of memory; every
   `--poll` s: the server's answered requests (one a sample), the trainer's logged steps and
   each process group's GPU memory and SM use (nvidia-smi);
6. the server stopped, the trainer alone from step 4's files (`--on-missing raise`,
   `--alone-steps` steps): its own steps/s and memory;
7. `seed.json`: samples/s, steps/s and tokens/s over the later part of the run (`--warm`: the
   first 40% of its time left out, while the data loaders fill their queues), the ratio to the
   server alone, peaks of memory, the hours an epoch of `--epoch-samples` samples takes at the
   measured rate, every phase's exit and time. A SIGTERM (the outer timeout) stops the server
   and the trainer and still writes seed.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from speculators_hybrid.models import PRESETS, resolve  # noqa: E402

EPOCH_SAMPLES = 913_786  # the seed job's dataset
ANSWERED = '"POST /v1/completions HTTP/1.1" 200'
OOM = re.compile(r"OutOfMemoryError|CUDA out of memory")


def layer_ids(preset: str) -> list[int]:
    """The trainer's ids: speculators' default [2, L/2, L-3] (the launcher adds L)."""
    layers = PRESETS[resolve(preset)]["layers"]
    return [2, layers // 2, layers - 3]


def steady_rate(points: list[tuple[float, int]], warm: float = 0.4) -> float | None:
    """Count/s over the part of the run after `warm` of its time, the run being from the first
    point past zero to the first point at the final count: the start (a trainer's data loaders
    fill their prefetch queues at the server's own pace) left out; None with too few points."""
    if not points or points[-1][1] <= 0:
        return None
    final = points[-1][1]
    first = next(p for p in points if p[1] > 0)
    end = next(p for p in points if p[1] == final)
    start = next(p for p in points if p[0] >= first[0] + warm * (end[0] - first[0]))
    if end[0] <= start[0] or end[1] <= start[1]:
        return None
    return (end[1] - start[1]) / (end[0] - start[0])


def hours_per_epoch(rate: float | None, samples: int = EPOCH_SAMPLES) -> float | None:
    return round(samples / rate / 3600, 2) if rate else None


def say(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} seed: {message}", flush=True)


def runner() -> list[str]:
    path = os.environ.get("RUNNER")
    return ["bash", path, "run"] if path else []


def count(log: Path | None, text: str) -> int:
    try:
        return log.read_text(errors="replace").count(text) if log else 0
    except OSError:
        return 0


class Poller:
    """Every `every` s: answered requests in the server's log and per-process GPU use."""

    def __init__(self, server_log: Path, every: float, out: Path) -> None:
        self.log, self.every, self.out = server_log, every, out
        self.points: list[tuple[float, int]] = []
        self.steps: list[tuple[float, int]] = []  # the trainer's logged steps
        self.trainer_log: Path | None = None
        self.gpu: list[dict[str, Any]] = []
        self.groups: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Poller:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.sample()

    def answered(self) -> int:
        return count(self.log, ANSWERED)

    def sample(self) -> None:
        now = time.time()
        self.points.append((now, self.answered()))
        self.steps.append((now, count(self.trainer_log, "global_step")))
        row: dict[str, Any] = {"t": now, **gpu_use(self.groups)}  # t unrounded: phases compare it
        if len(row) > 1:
            self.gpu.append(row)
        with self.out.open("a") as f:
            f.write(json.dumps({**row, "t": round(now, 1), "answered": self.points[-1][1]}) + "\n")


def smi(*args: str) -> list[list[str]]:
    exe = os.environ.get("NVIDIA_SMI", "nvidia-smi")
    try:
        out = subprocess.run([exe, *args], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.strip()]


def group_of(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[2])
    except (OSError, IndexError, ValueError):
        return None


def gpu_use(groups: dict[str, int]) -> dict[str, Any]:
    """MiB used on the GPU in all and by each named process group (the server, the trainer)."""
    row: dict[str, Any] = {}
    total = smi("--query-gpu=memory.used", "--format=csv,noheader,nounits")
    if total and total[0][0].isdigit():
        row["total_mib"] = int(total[0][0])
    for pid, used in smi("--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"):
        if not (pid.isdigit() and used.isdigit()):
            continue
        for name, pgid in list(groups.items()):
            if group_of(int(pid)) == pgid:
                row[f"{name}_mib"] = row.get(f"{name}_mib", 0) + int(used)
    for cols in smi_pmon():  # gpu pid type sm ...: SM % of each process in the last interval
        if len(cols) > 3 and cols[1].isdigit() and cols[3].isdigit():
            for name, pgid in list(groups.items()):
                if group_of(int(cols[1])) == pgid:
                    row[f"{name}_sm"] = row.get(f"{name}_sm", 0) + int(cols[3])
    return row


def smi_pmon() -> list[list[str]]:
    return [line[0].split() for line in smi("pmon", "-c", "1", "-s", "u")]


def peaks(rows: list[dict[str, Any]]) -> dict[str, int]:
    keys = {k for r in rows for k in r if k.endswith("_mib")}
    return {k: max(r.get(k, 0) for r in rows) for k in sorted(keys)}


def sm_share(rows: list[dict[str, Any]]) -> float | None:
    """The server's share of the SM use both processes reported (pmon), None without any."""
    rows = [r for r in rows if "trainer_sm" in r and "server_sm" in r]  # both running
    server = sum(r.get("server_sm", 0) for r in rows)
    both = server + sum(r.get("trainer_sm", 0) for r in rows)
    return round(server / both, 3) if both else None


def timed(
    cmd: list[str],
    log: Path,
    timeout: float,
    env: dict[str, str] | None = None,
    started: Callable[[int], object] | None = None,
) -> dict[str, Any]:
    """Run `cmd` in its own process group, logging to `log`; its whole group killed at timeout.
    `started(pid)` is called with the group's id once it runs."""
    t0 = time.time()
    with log.open("w") as f:
        proc = subprocess.Popen(
            cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )
        if started:
            started(proc.pid)
        try:
            rc = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            rc = 124
        finally:  # also when this process is stopped (SystemExit from the SIGTERM handler)
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return {"rc": rc, "seconds": round(time.time() - t0, 1)}


def wait_ready(proc: subprocess.Popen, port: int, seconds: float) -> bool:
    end = time.time() + seconds
    while time.time() < end:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return True
        except OSError:
            if proc.poll() is not None:
                return False
            time.sleep(2)
    return False


def server_cmd(a: argparse.Namespace) -> list[str]:
    serve = [
        f"--port={a.port}",
        "--load-format=dummy",
        f"--max-model-len={a.max_model_len}",
        f"--max-num-seqs={a.max_num_seqs}",
        f"--max-num-batched-tokens={a.max_num_batched_tokens}",
        f"--kv-cache-memory-bytes={int(a.kv_gib * (1 << 30))}",
        f"--gpu-memory-utilization={a.gpu_memory_utilization}",
        "--gdn-prefill-backend=triton",
        *(["--enforce-eager"] if not a.graphs else []),
    ]
    return [
        *runner(), sys.executable, "-m", "speculators_hybrid.cli", "launch",
        "--launcher", str(a.launcher), str(a.work / "verifier"),
        "--hidden-states-path", str(a.work / "hs"), "--", *serve,
    ]  # fmt: skip


def train_cmd(a: argparse.Namespace, anchors: int, offline: bool = False) -> list[str]:
    """The trainer, online from the server or (`offline`) from the server-alone phase's files."""
    source = (
        ["--hidden-states-path", str(a.work / "offline-hs"), "--on-missing", "raise"]
        if offline
        else ["--on-missing", "generate", "--vllm-endpoint", f"http://127.0.0.1:{a.port}/v1"]
    )
    steps, epochs = (a.alone_steps, 100) if offline else (a.steps, 1)
    data = a.work / ("data-alone" if offline else "data")
    return [
        *runner(), sys.executable, "-m", "speculators_hybrid.cli", "run", "--",
        sys.executable, "-m", "speculators", "train", "--speculator-type", "dflash",
        "--verifier-name-or-path", str(a.work / "verifier"), "--data-path", str(data),
        "--save-path", str(a.work / "train"), "--log-dir", str(a.work / "train" / "logs"),
        *source, "--target-layer-ids", *map(str, layer_ids(a.preset)),
        "--total-seq-len", str(a.total_seq_len), "--max-anchors", str(anchors),
        "--max-steps", str(steps), "--epochs", str(epochs), "--lr", "1e-4",
        "--num-workers", str(a.workers), "--log-freq", "1", *shlex.split(a.train_args),
    ]  # fmt: skip


def build_inputs(a: argparse.Namespace, report: dict[str, Any]) -> None:
    from benchmarks.seed_job import verifier

    if not (a.work / "verifier" / verifier.INDEX).exists():
        shutil.rmtree(a.work / "verifier", ignore_errors=True)
        report["verifier"] = verifier.write_verifier(a.work / "verifier", a.preset)
    if not (a.work / "chats.jsonl").exists():
        report["chats"] = verifier.write_chats(
            a.work / "verifier", a.work / "chats.jsonl", a.chats, a.min_tokens, a.max_tokens
        )
        (a.work / "chats.json").write_text(json.dumps(report["chats"]))
    report["chats"] = json.loads((a.work / "chats.json").read_text())


def prepare(a: argparse.Namespace, chats: Path, name: str) -> dict[str, Any]:
    """speculators' prepare-data of `chats` through the server into WORK/name."""
    shutil.rmtree(a.work / name, ignore_errors=True)
    cmd = [*runner(), sys.executable, "-m", "speculators", "prepare-data",
           "--model", str(a.work / "verifier"), "--data", str(chats),
           "--output", str(a.work / name), "--seq-length", str(a.max_model_len - 1),
           "--render-endpoint", f"http://127.0.0.1:{a.port}",
           "--num-preprocessing-workers", "8"]  # fmt: skip
    return timed(cmd, a.work / "logs" / f"prepare-{name}.log", 900)


def offline_rate(a: argparse.Namespace, poller: Poller, report: dict[str, Any]) -> None:
    """The server alone writes the files of the first `--offline-samples` chats (prepared on
    their own, `data-alone`: the trainer alone reads exactly these)."""
    with (a.work / "chats.jsonl").open() as f, (a.work / "chats-alone.jsonl").open("w") as g:
        g.writelines(line for _, line in zip(range(a.offline_samples), f, strict=False))
    report["prepare_alone"] = prepare(a, a.work / "chats-alone.jsonl", "data-alone")
    before, start = poller.answered(), len(poller.points)
    out = a.work / "offline-hs"
    cmd = [*runner(), sys.executable, "-m", "speculators", "generate-offline-data",
           "--endpoint", f"http://127.0.0.1:{a.port}/v1", "--preprocessed-data",
           str(a.work / "data-alone"), "--output", str(out),
           "--concurrency", str(a.offline_concurrency)]  # fmt: skip
    run = timed(cmd, a.work / "logs" / "offline.log", a.offline_timeout)
    poller.sample()
    points = [(t, n - before) for t, n in poller.points[start:]]
    done = points[-1][1]
    whole = round(done / run["seconds"], 3) if run["rc"] == 0 and run["seconds"] else None
    report["server_alone"] = {
        **run, "samples": done, "samples_per_s": steady_rate(points, a.warm) or whole,
        "samples_per_s_with_startup": whole,
    }  # fmt: skip


def train_once(a: argparse.Namespace, poller: Poller, anchors: int, offline: bool) -> dict:
    """One trainer run, polled: its exit, steps and (online) samples, with their steady rates."""
    shutil.rmtree(a.work / "train", ignore_errors=True)
    log = a.work / "logs" / f"train-{'alone' if offline else 'online'}-{anchors}.log"
    say(f"trainer{' alone' if offline else ''}: --max-anchors {anchors}")
    env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    if not a.compile:
        env["TORCHDYNAMO_DISABLE"] = "1"
    start, first, t0 = len(poller.points), poller.answered(), time.time()
    poller.trainer_log = log
    run = timed(train_cmd(a, anchors, offline), log, a.train_timeout, env,
                started=lambda pid: poller.groups.update(trainer=pid))  # fmt: skip
    poller.sample()
    poller.groups.pop("trainer", None)
    poller.trainer_log = None
    text = log.read_text(errors="replace")
    points = [(t, n - first) for t, n in poller.points[start:]]
    return {
        "max_anchors": anchors, **run, "steps_logged": text.count("global_step"),
        "steps_per_s": steady_rate(poller.steps[start:], a.warm),
        **({} if offline else {"samples": points[-1][1] if points else 0,
                               "samples_per_s": steady_rate(points, a.warm)}),
        "gpu_peak_mib": peaks([r for r in poller.gpu if r["t"] >= t0]),
        "out_of_memory": bool(OOM.search(text)),
        "last_lines": text.splitlines()[-5:],
    }  # fmt: skip


def train(a: argparse.Namespace, poller: Poller, report: dict[str, Any]) -> float | None:
    """The trainer beside the server at each `--max-anchors` in turn until one runs without
    running out of memory; returns the steady samples/s of the last attempt."""
    for anchors in a.anchors:
        report.setdefault("trainer", []).append(train_once(a, poller, anchors, offline=False))
        if not report["trainer"][-1]["out_of_memory"]:
            break
    return report["trainer"][-1]["samples_per_s"]


def trainer_alone(a: argparse.Namespace, poller: Poller, report: dict[str, Any]) -> None:
    """With the server stopped: the trainer from the server-alone phase's files, at the
    anchors the loop ended with; its steps/s and memory on a GPU of its own."""
    anchors = report["trainer"][-1]["max_anchors"] if report.get("trainer") else a.anchors[-1]
    report["trainer_alone"] = train_once(a, poller, anchors, offline=True)
    online = report.get("trainer") and report["trainer"][-1]
    if online and online["steps_per_s"] and report["trainer_alone"]["steps_per_s"]:
        report["trainer_alone"]["vs_loop_steps"] = round(
            report["trainer_alone"]["steps_per_s"] / online["steps_per_s"], 3
        )


def stop(server: subprocess.Popen, grace: float = 30) -> int | None:
    """SIGTERM to the server's process group, SIGKILL after `grace` s, then to what is left of
    the group (vLLM's engine core); its exit code."""
    if server.poll() is None:
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10)):
            try:
                os.killpg(server.pid, sig)
                server.wait(wait)
                break
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue
    try:
        os.killpg(server.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return server.poll()


def run_all(a: argparse.Namespace) -> dict[str, Any]:
    (a.work / "logs").mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"preset": a.preset, "settings": {
        k: str(v) if isinstance(v, Path) else v for k, v in vars(a).items()}}  # fmt: skip
    t0 = time.time()
    say(f"inputs for {a.preset}")
    build_inputs(a, report)
    report["inputs_s"] = round(time.time() - t0, 1)
    shutil.rmtree(a.work / "hs", ignore_errors=True)
    say("server: starting")
    server_log = a.work / "logs" / "server.log"
    with server_log.open("w") as f:
        server = subprocess.Popen(server_cmd(a), stdout=f, stderr=subprocess.STDOUT,
                                  start_new_session=True)  # fmt: skip
    (a.work / "gpu.jsonl").unlink(missing_ok=True)
    poller = Poller(server_log, a.poll, a.work / "gpu.jsonl")
    poller.groups["server"] = server.pid
    poller.start()
    try:
        t1 = time.time()
        if not wait_ready(server, a.port, a.server_timeout):
            report["failed"] = "server did not become ready"
            return report
        report["server_ready_s"] = round(time.time() - t1, 1)
        say(f"server: ready in {report['server_ready_s']} s; prepare-data")
        report["server_idle_mib"] = gpu_use(poller.groups)
        report["prepare_data"] = prepare(a, a.work / "chats.jsonl", "data")
        if report["prepare_data"]["rc"] != 0:
            report["failed"] = "prepare-data"
            return report
        if a.offline_samples:
            say("the server alone: generate-offline-data")
            offline_rate(a, poller, report)
        rate = train(a, poller, report)
        mean = report["chats"]["mean"]
        alone = (report.get("server_alone") or {}).get("samples_per_s")
        report["loop"] = {
            "samples_per_s": rate,
            "tokens_per_s": round(rate * mean, 1) if rate else None,
            "mean_tokens": mean,
            "vs_server_alone": round(rate / alone, 3) if rate and alone else None,
            "epoch_samples": a.epoch_samples,
            "hours_per_epoch": hours_per_epoch(rate, a.epoch_samples),
        }
        stop(server)
        if a.alone_steps and (a.work / "offline-hs").is_dir():
            trainer_alone(a, poller, report)
    finally:
        poller.stop()
        stop(server)
        shutil.rmtree(a.work / "offline-hs", ignore_errors=True)
        report["gpu_peak_mib"] = peaks(poller.gpu)
        report["server_sm_share"] = sm_share(poller.gpu)
        idle = report.get("server_idle_mib", {}).get("total_mib")
        if idle and "total_mib" in report["gpu_peak_mib"]:  # when per-process use is hidden
            report["trainer_mib_by_difference"] = report["gpu_peak_mib"]["total_mib"] - idle
        report["server_exit"] = server.returncode
        report["answered"] = poller.answered()
        report["seconds"] = round(time.time() - t0, 1)
        (a.work / "seed.json").write_text(json.dumps(report, indent=2))
    return report


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("work", type=Path)
    p.add_argument("--launcher", type=Path, required=True, help="speculators' launch_vllm.py")
    p.add_argument("--preset", default="qwen3.6-27b", type=resolve)
    p.add_argument("--chats", type=int, default=3000)
    p.add_argument("--min-tokens", type=int, default=1000)
    p.add_argument("--max-tokens", type=int, default=2000)
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--max-model-len", type=int, default=2049, help="prepare-data gets one less")
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--kv-gib", type=float, default=10.0)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.55)
    p.add_argument("--graphs", action="store_true", help="CUDA graphs (default: eager)")
    p.add_argument("--total-seq-len", type=int, default=8192)
    p.add_argument(
        "--anchors",
        type=int,
        nargs="+",
        default=[512, 256, 128],
        help="--max-anchors tried in turn while the trainer runs out of memory",
    )
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--workers", type=int, default=12)
    p.add_argument("--compile", action="store_true", help="leave torch.compile on")
    p.add_argument("--train-args", default="", help="more arguments for speculators train")
    p.add_argument("--offline-samples", type=int, default=256)
    p.add_argument(
        "--alone-steps",
        type=int,
        default=60,
        help="steps of the trainer alone from the offline files (0: none)",
    )
    p.add_argument("--offline-concurrency", type=int, default=32)
    p.add_argument("--warm", type=float, default=0.4, help="fraction of the run's time left out")
    p.add_argument("--poll", type=float, default=5.0)
    p.add_argument("--epoch-samples", type=int, default=EPOCH_SAMPLES)
    p.add_argument("--server-timeout", type=float, default=600)
    p.add_argument("--offline-timeout", type=float, default=300)
    p.add_argument("--train-timeout", type=float, default=600)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse(argv)
    except ValueError as e:
        print(f"seed: {e}", file=sys.stderr)
        return 2
    # a timeout's SIGTERM unwinds through the `finally`s: the server and trainer stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    report = run_all(args)
    print("seed:", json.dumps(report.get("loop") or report.get("failed")))
    return 0 if "loop" in report and report["loop"]["samples_per_s"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
