"""A real Mooncake store on loopback for the tests: `mooncake_master` and one store process
(`mooncake_client`, which holds the memory), both from the transfer engine's wheel.

    python tests/cpu/mooncake_store.py libibverbs DIR   # tox's mooncake env, before pytest

Mooncake's binaries need libibverbs.so.1, which its wheels leave out. The mooncake env puts
DIR (a link to rdma-core's copy in the pyverbs wheel) on LD_LIBRARY_PATH, so it runs on a
machine without the system package. docs/mooncake.md says how the store starts.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

LOOPBACK = "127.0.0.1"
READY_S = 30.0  # each process: listening within this, else the fixture fails
STOP_S = 10.0  # SIGTERM, then SIGKILL after this
SEGMENT = "64 MB"  # the store process's memory for objects (the tests' default)


def package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def link_libibverbs(folder: Path) -> None:
    """`folder`/libibverbs.so.1 -> pyverbs' bundled copy (its own name is hashed)."""
    pyverbs = package_dir("pyverbs")
    if pyverbs is None:
        raise SystemExit("mooncake_store: pyverbs is not installed (tox's mooncake env has it)")
    libs = pyverbs.parent / "pyverbs.libs"
    found = sorted(libs.glob("libibverbs-*.so*"))
    if not found:
        raise SystemExit(f"mooncake_store: no libibverbs in {libs}")
    folder.mkdir(parents=True, exist_ok=True)
    link = folder / "libibverbs.so.1"
    link.unlink(missing_ok=True)
    link.symlink_to(found[0])


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((LOOPBACK, port)) == 0


def _tail(log: Path, lines: int = 15) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


@dataclass
class Store:
    master: str  # host:port of the master's RPC service
    client_port: int  # the store process's own service
    logs: Path
    processes: list[subprocess.Popen[bytes]]


def _start(argv: list[str], log: Path, port: int, started: list[subprocess.Popen[bytes]]) -> None:
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    started.append(proc)
    deadline = time.monotonic() + READY_S
    while not _listening(port):
        if proc.poll() is not None:
            raise RuntimeError(f"{argv[0]} exited with {proc.returncode}:\n{_tail(log)}")
        if time.monotonic() > deadline:
            late = f"{argv[0]} not listening on {port} after {READY_S} s"
            raise RuntimeError(f"{late}:\n{_tail(log)}")
        time.sleep(0.05)


def stop(processes: list[subprocess.Popen[bytes]]) -> None:
    """Each process (newest first): SIGTERM, then SIGKILL; all reaped."""
    for proc in reversed(processes):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(STOP_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextmanager
def running_store(logs: Path, segment: str = SEGMENT) -> Iterator[Store]:
    """The master and a store process on free loopback ports, stopped on exit; `segment`: the
    store process's memory for objects (Mooncake's size syntax, e.g. "2 GB")."""
    binaries = package_dir("mooncake")
    if binaries is None:
        raise RuntimeError("mooncake-transfer-engine-non-cuda is not installed")
    rpc, metrics, client = free_port(), free_port(), free_port()
    master = f"{LOOPBACK}:{rpc}"
    started: list[subprocess.Popen[bytes]] = []
    try:
        _start(
            [str(binaries / "mooncake_master"), f"-rpc_address={LOOPBACK}", f"-rpc_port={rpc}"]
            + [f"-metrics_host={LOOPBACK}", f"-metrics_port={metrics}"]
            + ["-enable_metric_reporting=false", "-rpc_thread_num=2"],
            logs / "master.log",
            rpc,
            started,
        )
        _start(
            [str(binaries / "mooncake_client"), f"-host={LOOPBACK}", f"-port={client}"]
            + [f"-master_server_address={master}", "-metadata_server=P2PHANDSHAKE"]
            + ["-protocol=tcp", f"-global_segment_size={segment}"],
            logs / "store.log",
            client,
            started,
        )
        yield Store(master, client, logs, started)
    finally:
        stop(started)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "libibverbs":
        raise SystemExit(__doc__.split("\n\n")[1].strip())
    link_libibverbs(Path(os.path.expandvars(sys.argv[2])))
