"""GPU checks of the write path through `vllm serve` (issue 20; docs/reliability.md).

`speculators-hybrid launch` starts `vllm serve` for the tiny random Qwen3.5 hybrid with request
id headers on (a client then chooses the request id), then tests/gpu/reliability_client.py, a
plain HTTP client reading files as speculators does (the lock, then the file), checks:

1. `ids`: hostile request ids (`../../x`, an absolute path, NUL, 5,000 characters, `.`, `..`,
   `a/b/c`, unicode, a newline) through `X-Request-Id` and the body's `request_id`: every file
   directly in the storage folder, holding its prompt; nothing new beside the folder;
2. `bad`: decode (`max_tokens` 8), `n` 2, an empty prompt, a prompt over `max_model_len`, a
   streamed request: each answered (a file or an error) and the engine serves afterwards;
3. `load`: 1,000 concurrent requests of 1 to 4,000 tokens: 1,000 distinct files, each one's
   `token_ids` its prompt; the server's memory (API server and engine core) sampled;
4. `kill`: SIGKILL to the server's process group under a stream of long prompts: no partial
   file under a final name; then the same launch again on the same folder: its start removes
   the killed writers' part folders (`swept`), and it serves.

Needs a CUDA GPU and vLLM (and `tests/gpu/serve-deps.txt` staged). Numbers go to
`SPECULATORS_HYBRID_GPU_REPORT` (JSON); logs to `SPECULATORS_HYBRID_GPU_LOGDIR`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("vllm")

import hf_reference as hf  # noqa: E402  (tests/gpu is on sys.path)
from test_hidden_states_match import keep_log, write_report  # noqa: E402
from test_serve import Server, free_port, launch_argv  # noqa: E402

pytestmark = pytest.mark.gpu

CLIENT = Path(__file__).with_name("reliability_client.py")
MAX_MODEL_LEN = 4096  # test_serve.launch_argv's
LOAD = {  # vLLM flags after test_serve's (the last one of a flag wins): room for the load
    "--max-num-seqs": 128,
    "--max-num-batched-tokens": 8192,
}


def argv(folder: Path, storage: Path, port: int) -> list[str]:
    extra = [f"{k}={v}" for k, v in LOAD.items()] + ["--enable-request-id-headers"]
    return launch_argv(folder, storage, port, 1, False) + extra


def client(check: str, server: Server, storage: Path, *args: str) -> tuple[int, dict[str, Any]]:
    cmd = [sys.executable, str(CLIENT), check, "--url", server.url, "--dir", str(storage)]
    cmd += ["--model", MODEL, *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    last = (done.stdout.strip().splitlines() or ["{}"])[-1]
    try:
        found = json.loads(last)
    except json.JSONDecodeError:
        found = {"unreadable": done.stdout[-2000:], "stderr": done.stderr[-3000:]}
    if done.returncode not in (0, 1):
        found["stderr"] = done.stderr[-3000:]
    return done.returncode, found


MODEL = ""


def test_write_path_through_vllm_serve(tmp_path_factory, tmp_path: Path) -> None:
    import vllm

    global MODEL
    folder = hf.build_tiny_model(tmp_path_factory.mktemp("reliability_model") / "model")
    MODEL = str(folder)
    storage = tmp_path / "hs"
    report: dict[str, Any] = {"vllm": vllm.__version__}
    problems: list[str] = []
    port = free_port()
    server = Server(argv(folder, storage, port), tmp_path / "server.log", port)
    try:
        server.wait_ready()
        pid = str(server.proc.pid)
        for check, args in (
            ("ids", ()),
            ("bad", ("--max-model-len", str(MAX_MODEL_LEN))),
            ("load", ("--requests", "1000", "--concurrency", "256", "--pid", pid)),
        ):
            code, report[check] = client(check, server, storage, *args)
            if code:
                problems.append(f"{check}: {json.dumps(report[check])[:1500]}")
        before_kill = len(list(storage.glob("*.safetensors")))
        code, report["kill"] = client(
            "kill", server, storage, "--pid", pid, "--requests", "2000", "--concurrency", "64"
        )
        report["kill"]["files_written_under_load"] = (
            len(list(storage.glob("*.safetensors"))) - before_kill
        )
        if code:
            problems.append(f"kill: {json.dumps(report['kill'])[:1500]}")
        server.proc.wait(timeout=60)
    finally:
        server.stop()
        keep_log(server.log, "reliability-server.log")

    again = Server(argv(folder, storage, port), tmp_path / "server-again.log", port)
    try:
        again.wait_ready()
        code, report["swept"] = client("swept", again, storage)
        if code:
            problems.append(f"swept: {report['swept']}")
        code, report["after_restart"] = client("ids", again, storage)
        if code:
            problems.append(f"after restart: {json.dumps(report['after_restart'])[:1500]}")
    finally:
        again.stop()
        keep_log(again.log, "reliability-server-again.log")

    report["problems"] = problems
    write_report("reliability-serve", report)
    load = report.get("load", {})
    print(
        f"[reliability] SUMMARY vllm={vllm.__version__} ids_ok={report.get('ids', {}).get('ok')}"
        f" bad_alive={report.get('bad', {}).get('alive_after')}"
        f" load={load.get('whole_and_right')}/{load.get('requests')} files"
        f" {load.get('tokens_per_s', 0):.0f} tok/s rss={load.get('server_rss_mb')}"
        f" kill={report.get('kill')} swept={report.get('swept')} problems={len(problems)}"
    )
    assert not problems, "\n".join(problems)
