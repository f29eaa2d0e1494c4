"""GPU proof: `speculators-hybrid launch` starts `vllm serve`, speculators' client contract holds.

For a tiny random hybrid Qwen3.5 (multimodal and text-only checkpoints), the launcher (built-in,
or speculators' own `scripts/launch_vllm.py` if `SPECULATORS_HYBRID_LAUNCHER` names one) execs
`vllm serve`; prompts go to `/v1/completions` as speculators' data-generation client sends them
(token ids, `max_tokens=1`, `return_token_ids`), concurrently. Each answer must echo the prompt
ids and name a hidden-states file; each file must pass `speculators-hybrid verify`'s calibrated
rule against a float32 HuggingFace forward (and have no all-zero rows), and the storage folder
must hold exactly one file per request (with tensor parallelism one rank writes). The TP=2 case
needs two GPUs.

The server's extra wheels for the device are listed in `serve-deps.txt` (how to stage them there).
Numbers go to `SPECULATORS_HYBRID_GPU_REPORT` (JSON); server logs to
`SPECULATORS_HYBRID_GPU_LOGDIR`.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("vllm")

import hf_reference as hf  # noqa: E402  (tests/gpu is on sys.path)
from test_hidden_states_match import (  # noqa: E402
    IDS,
    check_extracted,
    keep_log,
    prompt_batches,
    worst_per_id,
    write_report,
)

pytestmark = pytest.mark.gpu

START_TIMEOUT_S = float(os.environ.get("SPECULATORS_HYBRID_GPU_TIMEOUT", "400"))
MULTICAST_OFF = {  # the device's rule: NVLink multicast stays off in every process
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch_argv(folder: Path, storage: Path, port: int, tp: int, prefix: bool) -> list[str]:
    """`speculators-hybrid launch ...` as a user would type it; vLLM flags after `--`."""
    argv = [sys.executable, "-m", "speculators_hybrid.cli", "launch"]
    if launcher := os.environ.get("SPECULATORS_HYBRID_LAUNCHER"):
        argv += ["--launcher", launcher]
    argv += [str(folder), "--hidden-states-path", str(storage), "--target-layer-ids"]
    argv += [str(i) for i in IDS]
    vllm_args = {
        "--port": port,
        "--tensor-parallel-size": tp,
        "--max-model-len": 4096,
        "--max-num-seqs": 8,
        "--max-num-batched-tokens": 512,
        "--kv-cache-memory-bytes": 2 * 1024**3,
        "--gpu-memory-utilization": 0.3,
        "--gdn-prefill-backend": "triton",  # no FlashInfer on the device
    }
    argv += ["--", *(f"{k}={v}" for k, v in vllm_args.items()), "--enforce-eager"]
    argv.append("--enable-prompt-tokens-details")  # usage reports cached tokens
    argv.append("--enable-prefix-caching" if prefix else "--no-enable-prefix-caching")
    return argv


class Server:
    """The launched server: its process group, log and base URL."""

    def __init__(self, argv: list[str], log: Path, port: int) -> None:
        self.log, self.url = log, f"http://127.0.0.1:{port}"
        env = dict(os.environ, PYTHONUNBUFFERED="1", VLLM_USE_FLASHINFER_SAMPLER="0")
        env.update(MULTICAST_OFF)
        self._out = open(log, "wb")
        self.proc = subprocess.Popen(
            argv, stdout=self._out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"server exited with {self.proc.returncode}:\n{self.text()[-6000:]}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(2)
        pytest.fail(f"server not ready after {START_TIMEOUT_S:.0f} s:\n{self.text()[-6000:]}")

    def complete(self, model: str, prompt: list[int]) -> dict[str, Any]:
        """One request the way speculators' client sends it (extra_body merged into the body)."""
        body = {"model": model, "prompt": prompt, "max_tokens": 1, "return_token_ids": True}
        req = urllib.request.Request(
            self.url + "/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=120) as r:
            return json.loads(r.read())

    def stop(self) -> None:
        for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                break
            try:
                self.proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        self._out.close()


def wait_written(path: Path) -> None:
    """As speculators' reader: wait for the file, then for the writer's `<path>.lock`."""
    deadline = time.monotonic() + 30
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    lock = Path(f"{path}.lock")
    if lock.exists():
        with open(lock, "rb") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            fcntl.flock(f, fcntl.LOCK_UN)


def check_answer(answer: dict[str, Any], prompt: list[int]) -> str:
    """speculators' checks on one response; the hidden-states path."""
    echoed = answer["choices"][0].get("prompt_token_ids")
    assert echoed == prompt, f"prompt_token_ids {'missing' if echoed is None else 'differ'}"
    params = answer.get("kv_transfer_params") or {}
    path = params.get("hidden_states_path") or params.get("handle")
    assert path, f"kv_transfer_params carry no path: {params}"
    return str(path)


CASES = [  # (case, multimodal checkpoint, tensor parallel size, prefix caching)
    ("multimodal-tp1-prefix-on", True, 1, True),
    ("text-only-tp1-prefix-off", False, 1, False),
    ("multimodal-tp2-prefix-on", True, 2, True),
]


@pytest.mark.parametrize(("case", "multimodal", "tp", "prefix"), CASES, ids=[c[0] for c in CASES])
def test_serve_through_launcher(
    tmp_path_factory: pytest.TempPathFactory,
    tmp_path: Path,
    case: str,
    multimodal: bool,
    tp: int,
    prefix: bool,
) -> None:
    if torch.cuda.device_count() < tp:
        pytest.skip(f"needs {tp} GPUs, {torch.cuda.device_count()} here")
    root = tmp_path_factory.mktemp("serve_model")
    folder = hf.build_tiny_model(root / "model", multimodal=multimodal)
    storage, port = tmp_path / "hs", free_port()
    server = Server(launch_argv(folder, storage, port, tp, prefix), tmp_path / "server.log", port)
    rows: list[dict[str, Any]] = []
    problems: list[str] = []
    try:
        server.wait_ready()
        for b, batch in enumerate(prompt_batches()):
            with ThreadPoolExecutor(len(batch)) as pool:
                answers = list(pool.map(lambda p: server.complete(str(folder), p), batch))
            for prompt, answer in zip(batch, answers, strict=True):
                label = f"batch{b}/len{len(prompt)}"
                usage = answer.get("usage") or {}
                details = usage.get("prompt_tokens_details") or {}
                row = {"prompt": label, "cached_tokens": details.get("cached_tokens")}
                rows.append(row)
                try:
                    path = Path(check_answer(answer, prompt))
                except AssertionError as e:
                    problems.append(f"{label}: {e}")
                    continue
                wait_written(path)
                check_extracted(label, path, prompt, folder, IDS, row, problems)
    finally:
        server.stop()
        keep_log(server.log, f"serve-{case}.log")
    log = server.text()
    command = next((ln for ln in log.splitlines() if " serve " in ln and "--speculative" in ln), "")
    files = sorted(p.name for p in storage.glob("*.safetensors")) if storage.exists() else []
    if len(files) != len(rows):
        problems.append(f"{len(files)} files for {len(rows)} requests: {files}")
    if multimodal and "--language-model-only" not in command:
        problems.append(f"launch did not add --language-model-only: {command!r}")
    per_id, worst = worst_per_id(rows, IDS)
    import vllm

    write_report(
        f"serve-{case}",
        {
            "vllm": vllm.__version__,
            "launcher": os.environ.get("SPECULATORS_HYBRID_LAUNCHER", "built-in"),
            "command": command,
            "tensor_parallel_size": tp,
            "prefix_caching": prefix,
            "files": len(files),
            "min_cos_per_id": per_id,
            "prompts": rows,
            "problems": problems,
        },
    )
    hits = [r["cached_tokens"] or 0 for r in rows if r["prompt"].startswith("batch1/")]
    print(
        f"[serve] SUMMARY {case} vllm={vllm.__version__} files={len(files)}/{len(rows)}"
        f" min cos per id {worst} batch-1 cached tokens {hits} problems={len(problems)}"
    )
    assert not problems, f"{case}:\n" + "\n".join(problems)
    if prefix and "prefix caching turned off" not in log:
        assert max(hits) > 0, f"{case}: prefix caching on but no cache hit in batch 1: {hits}"
