"""Faults on the write path, injected through the OS, with real files.

A full disk (a tiny tmpfs where `mount` is allowed; everywhere: the file-size limit
RLIMIT_FSIZE, which fails the write with EFBIG as a full disk fails it with ENOSPC), a folder that
refuses new files (chattr +i, or a read-only tmpfs), a folder deleted under the server, a
failing writer thread, and a writer killed with SIGKILL mid-write. After each: no file (whole or
partial) under the final name, the lock released, the cause logged with the path, the request
failed with `hidden_states_error` where its response is not yet sent, the next request served.
Tests run as root, which ignores permission bits: hence chattr / mounts, not chmod. vLLM's
connector (>= 0.24) keeps serving past such a folder through hidden-states-folder-faults.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import resource
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
import torch
from conftest import needs, our_connector
from safetensors.torch import load_file
from upstream_worker import cpu_copies  # noqa: F401 (a fixture)

from speculators_hybrid.vllm_patches import file_names, writer

OURS = [pytest.mark.shim_only, our_connector()]
BIG = list(range(1, 1201))  # 1,200 tokens: 1.8 MB of bf16 hidden states (3 ids x 256)
SMALL = list(range(1, 21))
LIMIT = 1 << 20  # RLIMIT_FSIZE for the EFBIG cases: BIG does not fit, SMALL does


@contextlib.contextmanager
def file_size_limit(nbytes: int):
    """Files this process writes cannot grow past `nbytes` (EFBIG, SIGXFSZ ignored)."""
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, old_limit[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)


def _mount(*args: str) -> str | None:
    done = subprocess.run(["mount", *args], capture_output=True, text=True)
    return None if done.returncode == 0 else (done.stderr.strip() or f"exit {done.returncode}")


@contextlib.contextmanager
def immutable(folder: Path):
    """`folder` takes no new file, even from root (chattr +i; a read-only tmpfs otherwise)."""
    done = subprocess.run(["chattr", "+i", str(folder)], capture_output=True, text=True)
    if done.returncode == 0:
        try:
            yield
        finally:
            subprocess.run(["chattr", "-i", str(folder)], check=True)
        return
    error = _mount("-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(folder))
    if error is not None:
        pytest.skip(f"neither chattr +i ({done.stderr.strip()}) nor a read-only mount ({error})")
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def assert_nothing_half_written(folder: Path, path: str) -> None:
    """No file under the final name, no part left, and the lock (if any) free."""
    assert not os.path.exists(path)
    assert not [n for n in os.listdir(folder) if n.endswith(".part")], os.listdir(folder)
    if os.path.exists(f"{path}.lock"):
        with open(f"{path}.lock") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a reader would not wait forever


def served(made, req_id: str = "after") -> None:
    """The engine serves the next request: its file is whole."""
    params = made.run(req_id, SMALL)
    made.drain()
    assert "hidden_states_error" not in params, params
    assert load_file(params["hidden_states_path"])["token_ids"].tolist() == SMALL


def logged(caplog, *parts: str, wait: float = 30.0) -> None:
    """An error record holds every part, within `wait` s: a writer thread may log after
    it released the file's lock (vLLM's connector logs from the write's done-callback)."""
    deadline = time.monotonic() + wait
    while True:
        text = "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR)
        missing = [part for part in parts if part not in text]
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not missing, (missing, text)


# ---- our connector (vLLM < 0.22; 0.22-0.23 with chunked prefill) ----


@pytest.mark.parametrize("mode", ["in_step", "off_step"])
@pytest.mark.parametrize("fault", ["efbig", "enospc"])
@OURS[0]
@OURS[1]
def test_a_full_disk_loses_one_file_and_nothing_else(shim, tmp_path, caplog, mode, fault):
    from reliability_rig import rig

    if fault == "enospc":
        folder = _tiny_disk_or_skip(tmp_path)
        limit = contextlib.nullcontext()
        cause = "No space left on device"
    else:
        folder = tmp_path / "store"
        limit = file_size_limit(LIMIT)
        cause = "File too large"
    made = rig(str(folder), async_writes=mode == "off_step")
    with limit:
        params = made.run("big", BIG)
        made.drain()
    path = str(folder / "big.safetensors")
    logged(caplog, path, cause)
    assert_nothing_half_written(folder, path)
    if mode == "in_step":  # the response is not sent yet: the request fails, saying why
        assert params["hidden_states_path"] is None
        assert path in params["hidden_states_error"] and cause in params["hidden_states_error"]
    elif params["hidden_states_path"] is None:  # the thread failed before the request ended
        assert path in params["hidden_states_error"] and cause in params["hidden_states_error"]
    else:  # sent before the write failed: the reader finds the lock free and no file
        assert params == {"hidden_states_path": path}
    served(made)
    made.worker.shutdown()


_mounted: list[Path] = []


def _tiny_disk_or_skip(tmp_path: Path) -> Path:
    where = tmp_path / "disk"
    where.mkdir()
    error = _mount("-t", "tmpfs", "-o", "size=512k", "tmpfs", str(where))
    if error is not None:
        pytest.skip(f"cannot mount a tmpfs here ({error}); the EFBIG case covers a full disk")
    _mounted.append(where)
    return where


@pytest.fixture(autouse=True)
def _unmount():
    yield
    while _mounted:
        subprocess.run(["umount", "-l", str(_mounted.pop())], check=False)


@pytest.mark.parametrize("mode", ["in_step", "off_step"])
@OURS[0]
@OURS[1]
def test_a_folder_that_takes_no_file_fails_the_request_not_the_engine(shim, tmp_path, caplog, mode):
    from reliability_rig import rig

    folder = tmp_path / "store"
    folder.mkdir()
    made = rig(str(folder), async_writes=mode == "off_step")
    path = str(folder / "ro.safetensors")
    with immutable(folder):
        params = made.run("ro", SMALL)  # the lock cannot be made: fails in the step either way
        made.drain()
        assert os.listdir(folder) == []
    assert params["hidden_states_path"] is None
    assert params["hidden_states_error"].startswith(f"could not write {path}: ")
    logged(caplog, f"could not write {path}: ")
    served(made)
    made.worker.shutdown()


@OURS[0]
@OURS[1]
def test_a_deleted_folder_is_made_again(shim, tmp_path):
    from reliability_rig import rig

    folder = tmp_path / "store"
    made = rig(str(folder))
    served(made, "first")
    shutil.rmtree(folder)
    served(made, "second")  # the next write makes the folder again
    made.worker.shutdown()


@OURS[0]
@OURS[1]
def test_a_folder_deleted_during_an_off_step_write(shim, tmp_path, monkeypatch):
    import threading

    from reliability_rig import rig

    folder = tmp_path / "store"
    made = rig(str(folder))
    release = threading.Event()
    real = writer.save_whole

    def held(*args, **kwargs):  # the disk is slow; meanwhile the folder goes
        assert release.wait(30)
        real(*args, **kwargs)

    monkeypatch.setattr(writer, "save_whole", held)
    params = made.run("gone", SMALL)
    path = params["hidden_states_path"]
    shutil.rmtree(folder)
    release.set()
    made.drain()
    # The aside folder is made with its parents: the file is written whole all the same.
    assert load_file(path)["token_ids"].tolist() == SMALL
    assert not [n for n in os.listdir(folder) if n.endswith(".part")]
    monkeypatch.setattr(writer, "save_whole", real)
    served(made)
    made.worker.shutdown()


def test_a_failing_writer_thread_releases_the_lock_and_the_pool_writes_on(tmp_path, caplog):
    files = writer.FileWriter(threads=1)
    path = str(tmp_path / "bad.safetensors")
    unwritable = torch.zeros(2, 3, 8, dtype=torch.complex64)  # no safetensors dtype for it
    files.submit(path, {"hidden_states": unwritable, "token_ids": torch.arange(2)}, None)
    files.drain()
    logged(caplog, f"could not write {path}: ", "complex64")
    assert_nothing_half_written(tmp_path, path)
    assert "complex64" in (tmp_path / "bad.safetensors.rejected").read_text()
    good = str(tmp_path / "good.safetensors")
    files.submit(good, {"hidden_states": torch.ones(2, 3, 8), "token_ids": torch.arange(2)}, None)
    files.shutdown()
    assert load_file(good)["token_ids"].tolist() == [0, 1]


def test_a_marker_the_folder_cannot_take_whole_is_not_left(tmp_path):
    """The scheduler reads `<path>.rejected` while a writer thread may be making it (or the
    disk fills under it): it finds the whole reason or none, never a part of one."""
    path = str(tmp_path / "full.safetensors")
    with file_size_limit(16):  # the reason is longer: its write stops part way
        reason = writer.report_failure(path, OSError(28, "No space left on device"))
    assert "No space left on device" in reason
    assert writer.take_failure(path) is None
    assert os.listdir(tmp_path) == []  # no marker, no part of one
    writer.report_failure(path, OSError(28, "No space left on device"))
    assert writer.take_failure(path) == reason


# ---- vLLM >= 0.22: vLLM's own connector (with hidden-states-provenance's write aside) ----


@pytest.mark.shim_only  # the write aside is the plugin's (hidden-states-provenance)
@needs("hidden-states-provenance")
@pytest.mark.usefixtures("cpu_copies")
def test_vllms_connector_a_full_disk_loses_one_file(shim, tmp_path, caplog):
    from test_reliability_ids import _upstream
    from upstream_worker import extract, extraction, load

    config, kv = _upstream(tmp_path)
    with extraction(config, kv) as ex:
        with file_size_limit(LIMIT):
            path = extract(ex, "big", torch.randn(len(BIG), 3, 256))["hidden_states_path"]
            with pytest.raises(FileNotFoundError):  # vLLM's reader: lock free, no file
                load(path)
        assert_nothing_half_written(tmp_path, path)
        after = extract(ex, "after", torch.randn(len(SMALL), 3, 256))["hidden_states_path"]
        assert load(after)["token_ids"].tolist() == SMALL
    logged(caplog, "Hidden-states write failed for req_id=big", "File too large")


@needs("hidden-states-folder-faults")
@pytest.mark.usefixtures("cpu_copies")
def test_vllms_connector_a_folder_that_takes_no_file_fails_one_request(shim, tmp_path):
    """vLLM >= 0.24 with hidden-states-folder-faults: the lock cannot be made, the request's
    file is lost with a log line naming path and cause, the engine writes the next one."""
    from test_reliability_ids import _upstream
    from upstream_worker import extract, extraction, load

    folder = tmp_path / "store"
    folder.mkdir()
    config, kv = _upstream(folder)
    # On vLLM's "vllm" logger itself (ours, and the connector's in a patched vLLM, are its
    # children): vLLM >= 0.33 keeps its loggers from caplog.
    lines: list[str] = []
    catch = logging.Handler(logging.ERROR)
    catch.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    ours = logging.getLogger("vllm")
    ours.addHandler(catch)
    with extraction(config, kv) as ex:
        with immutable(folder):
            path = extract(ex, "ro", torch.randn(len(SMALL), 3, 256))["hidden_states_path"]
            assert os.listdir(folder) == []
        with pytest.raises(FileNotFoundError):  # vLLM's reader: no lock, no file
            load(path)
        after = extract(ex, "after", torch.randn(len(SMALL), 3, 256))["hidden_states_path"]
        assert load(after)["token_ids"].tolist() == SMALL
    ours.removeHandler(catch)
    assert any(f"could not write {path}: " in line for line in lines), lines


@needs("hidden-states-folder-faults")
@pytest.mark.usefixtures("cpu_copies")
def test_without_the_patch_a_folder_that_takes_no_file_stops_the_engine(shim, tmp_path):
    from test_reliability_ids import _upstream
    from upstream_worker import extract, extraction, without

    folder = tmp_path / "store"
    folder.mkdir()
    config, kv = _upstream(folder)
    with without("hidden-states-folder-faults"), extraction(config, kv) as ex:
        with immutable(folder), pytest.raises(OSError):  # out of the worker's step
            extract(ex, "ro", torch.randn(len(SMALL), 3, 256))


# ---- a writer killed mid-write ----

KILLED = """
import sys, torch
from speculators_hybrid.vllm_patches.writer import FileWriter
path = sys.argv[1]
files = FileWriter(threads=1)
tensors = {"hidden_states": torch.ones(96, 1024, 1024), "token_ids": torch.arange(8)}
files.submit(path, tensors, None)
print("submitted", flush=True)
files.drain()
print("written", flush=True)
"""


def killed_mid_write(folder: Path) -> str:
    """A writer process (our FileWriter) SIGKILLed while its 384 MiB file is half written."""
    folder.mkdir(exist_ok=True)
    path = str(folder / f"killed-{uuid.uuid4().hex[:8]}.safetensors")
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(KILLED), path],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            parts = [p for p in folder.iterdir() if p.name.endswith(".part")]
            inside = [f for p in parts for f in p.iterdir()] if parts else []
            if any(f.stat().st_size > (1 << 20) for f in inside):
                break  # more than 1 MiB in, far from done
            time.sleep(0.002)
        else:
            raise AssertionError(f"the writer never got going: {proc.poll()}")
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    assert "written" not in proc.stdout.read()  # type: ignore[union-attr]
    return path


def test_a_killed_writer_leaves_no_file_under_the_final_name(tmp_path):
    path = killed_mid_write(tmp_path / "store")
    assert not os.path.exists(path)
    left = [p.name for p in (tmp_path / "store").iterdir()]
    assert sorted(n.rsplit(".", 2)[-1] for n in left) == ["lock", "part"], left
    with open(f"{path}.lock") as lock:  # the kernel dropped the dead writer's lock
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    assert file_names.sweep(str(tmp_path / "store")) != []
    assert sorted(p.name for p in (tmp_path / "store").iterdir()) == [
        os.path.basename(path) + ".lock"
    ]


def test_the_sweep_leaves_a_live_writers_part_alone(tmp_path):
    final = tmp_path / "live.safetensors"
    part = tmp_path / f"live.safetensors.{os.getpid()}.part"
    part.mkdir()
    (part / ".tmpAbC123").write_bytes(b"x" * 100)
    with open(f"{final}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a writer at work (another open file: flock conflicts)
        assert file_names.sweep(str(tmp_path)) == []
        assert part.is_dir()
    assert file_names.sweep(str(tmp_path)) == [str(part)]  # its writer gone: swept
    orphan = tmp_path / "nolock.safetensors.123.part"  # no lock file at all: by age
    orphan.mkdir()
    assert file_names.sweep(str(tmp_path)) == []
    old = time.time() - file_names.STALE_S - 5
    os.utime(orphan, (old, old))
    assert file_names.sweep(str(tmp_path)) == [str(orphan)]
    for name in ("other.safetensors", "x.part", "y.safetensors.lock"):  # not parts: kept
        (tmp_path / name).write_bytes(b"")
    assert file_names.sweep(str(tmp_path)) == []


@OURS[0]
@OURS[1]
def test_our_connector_sweeps_a_killed_writers_leftovers_at_start(shim, tmp_path):
    from reliability_rig import rig

    path = killed_mid_write(tmp_path / "store")
    made = rig(str(tmp_path / "store"))  # the worker-side connector starts
    assert sorted(p.name for p in (tmp_path / "store").iterdir()) == [
        os.path.basename(path) + ".lock"
    ]
    served(made)
    made.worker.shutdown()


@pytest.mark.shim_only  # the sweep is the runtime form's (the diff has no write aside to sweep)
@needs("hidden-states-safe-file-names")
@pytest.mark.usefixtures("cpu_copies")
def test_vllms_connector_sweeps_a_killed_writers_leftovers_at_start(shim, tmp_path):
    from test_reliability_ids import _upstream
    from upstream_worker import extraction

    path = killed_mid_write(tmp_path / "store")
    config, kv = _upstream(tmp_path / "store")
    with extraction(config, kv):  # vLLM's factory makes the worker-side connector
        names = sorted(p.name for p in (tmp_path / "store").iterdir())
    assert names == [os.path.basename(path) + ".lock"]
