"""Who can read a file when (vLLM < 0.22, our connector): docs/files.md's reader rule, each mode.

Off the step (the default): a reader that waits on `<path>.lock` (speculators >= 0.6) and
`vllm.LLM`'s caller (files-whole-when-generate-returns) get whole files only, however slow the
disk; a reader that does not wait (speculators 0.5.0) may find no file, which is why `launch`
writes in the step where speculators 0.5.0 is installed. In the step: the file is whole before
the step returns, so before the response. No mode ever shows a part file under the final name.
The writer threads, the connector and `LLM._run_engine` are the real ones; the disk is made
slow by holding the write; the engine under `LLM` is a stand-in (a model cannot run here).
"""

from __future__ import annotations

import fcntl
import os
import threading
import time

import pytest
import torch
from conftest import needs
from safetensors.torch import load_file
from test_connector_worker import async_connector  # a worker-side connector on a CPU cache

from speculators_hybrid import switches
from speculators_hybrid.vllm_patches import provenance_meta, writer
from speculators_hybrid.vllm_patches.connector import HiddenStatesMetadata, SaveRequest, slots_for

pytestmark = needs("keep-hma-for-extraction", "files-whole-when-generate-returns")

PROMPT = list(range(100, 130))


def step(made, name, cache, path) -> None:
    """One engine step that finishes the request: the file is saved from it."""
    slots = slots_for([3, 5], 16, len(PROMPT))
    made.bind_connector_metadata(HiddenStatesMetadata([SaveRequest("r", path, PROMPT, slots)]))
    made.save_kv_layer(name, cache, None)


@pytest.fixture
def slow_disk(monkeypatch):
    """Writes wait for `release`; every rename into place is checked to move a whole file."""
    release = threading.Event()
    real_save, real_replace = writer.save_whole, os.replace
    renamed: list[str] = []

    def held(*args, **kwargs):
        assert release.wait(30)
        real_save(*args, **kwargs)

    def checked(src, dst):
        assert load_file(src)["token_ids"].tolist() == PROMPT  # whole before it is visible
        renamed.append(str(dst))
        real_replace(src, dst)

    monkeypatch.setattr(writer, "save_whole", held)
    monkeypatch.setattr(provenance_meta.os, "replace", checked)
    return release, renamed


def watch(path: str, stop: threading.Event, seen: list[int]) -> threading.Thread:
    """Polls the final name the whole time: each size it sees is recorded."""

    def run() -> None:
        while not stop.is_set():
            if os.path.exists(path):
                seen.append(os.path.getsize(path))
            time.sleep(0.0005)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def speculators_reader(path: str, got: dict) -> threading.Thread:
    """speculators >= 0.6: poll the lock without blocking, remove it, then load the file."""

    def run() -> None:
        fd = os.open(f"{path}.lock", os.O_RDONLY)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    time.sleep(0.01)
        finally:
            os.close(fd)
        os.remove(f"{path}.lock")
        got["data"] = load_file(path)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_off_the_step_a_reader_that_waits_gets_the_whole_file(shim, tmp_path, slow_disk):
    release, renamed = slow_disk
    made, name, cache = async_connector(tmp_path)
    assert made._writer is not None  # the default
    path = str(tmp_path / "r.safetensors")
    stop, sizes, got = threading.Event(), [], {}
    watcher = watch(path, stop, sizes)

    step(made, name, cache, path)  # returns with the write pending: the response may go now
    reader = speculators_reader(path, got)
    assert not os.path.exists(path)  # a reader that does not wait (speculators 0.5.0) fails
    reader.join(0.3)
    assert reader.is_alive()  # the waiting reader is still waiting
    release.set()
    reader.join(30)
    made.shutdown()
    stop.set()
    watcher.join()

    assert got["data"]["token_ids"].tolist() == PROMPT
    assert renamed == [path]
    assert set(sizes) <= {os.path.getsize(path)}  # never a part file under the final name


def test_in_the_step_the_file_is_whole_when_the_step_returns(shim, tmp_path, monkeypatch):
    monkeypatch.setenv(switches.ASYNC_WRITES, "0")  # what `launch` sets for speculators 0.5.0
    made, name, cache = async_connector(tmp_path)
    assert made._writer is None
    path = str(tmp_path / "r.safetensors")
    step(made, name, cache, path)
    assert load_file(path)["token_ids"].tolist() == PROMPT  # no wait: 0.5.0's reader is served
    made.shutdown()


class _Engine:
    """Stands in for LLMEngine (no model on the CPU): one step finishes one request."""

    def __init__(self, output) -> None:
        self.outputs = [output]

    def get_num_unfinished_requests(self) -> int:
        return len(self.outputs)

    def has_unfinished_requests(self) -> bool:
        return bool(self.outputs)

    def step(self):
        return [self.outputs.pop()]


def run_llm(path: str, result: dict) -> threading.Thread:
    """vLLM's own `LLM._run_engine` (patched or not) over the stand-in engine."""
    from vllm import LLM
    from vllm.outputs import CompletionOutput, RequestOutput

    done = CompletionOutput(0, "", [7], 0.0, None)
    output = RequestOutput(
        "0", None, PROMPT, None, [done], True, kv_transfer_params={"hidden_states_path": path}
    )
    llm = object.__new__(LLM)
    llm.llm_engine = _Engine(output)

    def run() -> None:
        outputs = llm._run_engine(output_type=RequestOutput, use_tqdm=False)
        result["file"] = os.path.exists(path) and load_file(path)["token_ids"].tolist()
        result["outputs"] = outputs

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("patched", [True, False])
def test_llm_generate_returns_when_its_files_are_whole(tmp_path, slow_disk, patched, request):
    release, _ = slow_disk
    request.getfixturevalue("shim" if patched else "no_shim")
    files = writer.FileWriter(threads=1)  # the connector's writer, as in the engine
    path = str(tmp_path / "r.safetensors")
    tensors = {"hidden_states": torch.zeros(len(PROMPT), 3, 8), "token_ids": torch.tensor(PROMPT)}
    files.submit(path, tensors, None)  # in the step: the lock is held before the output leaves
    result: dict = {}
    caller = run_llm(path, result)
    caller.join(0.3)
    if patched:
        assert caller.is_alive()  # generate waits for the writer
    else:
        assert result["file"] is False  # stock: generate returned before the file existed
    release.set()
    caller.join(30)
    files.shutdown()
    if patched:
        assert result["file"] == PROMPT and len(result["outputs"]) == 1
