"""GPU checks of the write path (docs/reliability.md), against a running `vllm serve`.

Start the server through `speculators-hybrid launch` (storage folder DIR), then:

    python tests/gpu/reliability_client.py ids  --url http://127.0.0.1:8000 --dir DIR
    python tests/gpu/reliability_client.py bad  --url ... --dir DIR --max-model-len N
    python tests/gpu/reliability_client.py load --url ... --dir DIR --requests 1000 --pid PID
    python tests/gpu/reliability_client.py kill --url ... --dir DIR --pid PID   # then restart
    python tests/gpu/reliability_client.py swept --dir DIR                      # after restart

PID is the server's process group (the launched process when started in a session of its own,
as tests/gpu/test_reliability_serve.py does): `load` sums the memory of every process in it (API
server and engine core), `kill` sends SIGKILL to all of them at once, as a crash of the host
process would.

Each prints one JSON line of findings and exits non-zero on a broken guarantee. Files are read
as speculators' reader does: wait on `<path>.lock`, read, remove the lock. Only the standard
library and safetensors (numpy) are needed on the client side.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import random
import signal
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

HOSTILE = [
    "../../x",
    "/etc/cron.d/evil",
    "a\x00b",
    "x" * 5000,
    ".",
    "..",
    "a/b/c",
    "r\u00e9qu\u00eate-\U0001f600",
    "a\nb",
]


def post(url: str, body: dict, request_id: str | None = None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"}
    if request_id is not None:  # header values cannot carry NUL/newline: body only then
        if request_id.isprintable() and request_id.isascii():
            headers["X-Request-Id"] = request_id
        body = {**body, "request_id": request_id}
    data = json.dumps(body).encode()
    req = urllib.request.Request(f"{url}/v1/completions", data, headers)
    try:
        with urllib.request.urlopen(req, timeout=600) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def completion(prompt: list[int], **extra: Any) -> dict:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 1, "return_token_ids": True}
    return {**body, **extra}


def hidden_path(answer: dict) -> str | None:
    params = answer.get("kv_transfer_params") or {}
    if not params:
        params = (answer.get("choices") or [{}])[0].get("kv_transfer_params") or {}
    return params.get("hidden_states_path")


def read(path: str) -> list[int]:
    """speculators' reader: the lock, then the file; the lock removed."""
    from safetensors import safe_open

    lock = f"{path}.lock"
    if os.path.exists(lock):
        with open(lock) as held:
            fcntl.flock(held, fcntl.LOCK_SH)
            tokens = _tokens(safe_open, path)
        os.remove(lock)
        return tokens
    return _tokens(safe_open, path)


def _tokens(safe_open: Any, path: str) -> list[int]:
    with safe_open(path, "np") as f:
        return f.get_tensor("token_ids").tolist()


def inside(folder: str, path: str) -> bool:
    real = os.path.realpath(path)
    return os.path.dirname(real) == os.path.realpath(folder)


def check_ids(args: argparse.Namespace) -> dict:
    """Hostile ids (X-Request-Id and the body's request_id): files only inside the folder."""
    parent = os.path.dirname(os.path.realpath(args.dir))
    before = set(os.listdir(parent))
    found: dict[str, Any] = {}
    for i, rid in enumerate(HOSTILE):
        prompt = [100 + i] * (10 + i)
        status, answer = post(args.url, completion(prompt), rid)
        path = hidden_path(answer)
        ok = status == 200 and path is not None and inside(args.dir, path)
        ok = ok and read(path) == prompt  # type: ignore[arg-type]
        found[repr(rid[:20])] = {"status": status, "path": path, "ok": ok}
    # must stay empty (the folder itself is made by the first write)
    new_beside = sorted(set(os.listdir(parent)) - before - {os.path.basename(args.dir)})
    ok = all(v["ok"] for v in found.values()) and not new_beside
    return {"ids": found, "ok": ok, "new_beside_the_folder": new_beside}


def check_bad(args: argparse.Namespace) -> dict:
    prompt = list(range(1, 41))
    cases = {
        "max_tokens_8": completion(prompt, max_tokens=8),
        "n_2": completion(prompt, n=2, temperature=1.0),
        "empty_prompt": completion([]),
        "too_long": completion([1] * (args.max_model_len + 1)),
        "stream": completion(prompt, stream=True),
    }
    found = {}
    for name, body in cases.items():
        if name == "stream":
            req = urllib.request.Request(
                f"{args.url}/v1/completions",
                json.dumps(body).encode(),
                {"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(req, timeout=600) as reply:
                text = reply.read().decode()
            found[name] = {"status": 200, "paths": sorted(set(_paths_in(text)))}
            continue
        status, answer = post(args.url, body)
        per_choice = [hidden_path(c) for c in answer.get("choices", [])]
        paths: list[str | None] = [p for p in per_choice if p] or [hidden_path(answer)]
        tokens = [read(p) for p in paths if p]
        found[name] = {
            "status": status,
            "paths": paths,
            "prompt_files": sum(t == body["prompt"] for t in tokens),
            "error": answer.get("error", answer.get("message")),
        }
    alive = post(args.url, completion(prompt))[0] == 200  # the engine still serves
    return {"bad": found, "alive_after": alive}


def _paths_in(text: str) -> list[str]:
    out = []
    for line in text.splitlines():
        if line.startswith("data: {"):
            answer = json.loads(line[6:])
            for choice in answer.get("choices", []):
                if (p := hidden_path(choice)) is not None:
                    out.append(p)
            if (p := hidden_path(answer)) is not None:
                out.append(p)
    return out


def rss_mb(group: int) -> float:
    """Resident memory of every process in process group `group` (MiB)."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.getpgid(int(entry)) != group:
                continue
            with open(f"/proc/{entry}/status") as f:
                total += next((int(ln.split()[1]) for ln in f if ln.startswith("VmRSS:")), 0)
        except (OSError, ProcessLookupError):
            continue  # gone meanwhile
    return total / 1024


def check_load(args: argparse.Namespace) -> dict:
    rng = random.Random(20)
    prompts = [
        [rng.randint(1, args.vocab - 1) for _ in range(rng.randint(1, 4000))]
        for _ in range(args.requests)
    ]
    memory = [rss_mb(args.pid)] if args.pid else []
    start = time.monotonic()

    def one(prompt: list[int]) -> tuple[bool, str | None]:
        status, answer = post(args.url, completion(prompt))
        path = hidden_path(answer)
        return status == 200 and path is not None and read(path) == prompt, path

    with ThreadPoolExecutor(args.concurrency) as pool:
        results = []
        for i, result in enumerate(pool.map(one, prompts)):
            results.append(result)
            if args.pid and i % 100 == 0:
                memory.append(rss_mb(args.pid))
    seconds = time.monotonic() - start
    paths = [p for _, p in results if p]
    return {
        "requests": len(prompts),
        "whole_and_right": sum(ok for ok, _ in results),
        "distinct_files": len(set(paths)),
        "tokens_per_s": sum(map(len, prompts)) / seconds,
        "seconds": seconds,
        "server_rss_mb": memory,
    }


def check_kill(args: argparse.Namespace) -> dict:
    """A stream of long prompts in flight, then SIGKILL to the server's whole process group: no
    file under a final name is partial."""
    from safetensors import safe_open

    bodies = [completion([7 + i % 50] * 4000) for i in range(args.requests)]
    with ThreadPoolExecutor(args.concurrency) as pool:
        futures = [pool.submit(post, args.url, b) for b in bodies]
        time.sleep(args.after)
        os.killpg(args.pid, signal.SIGKILL)
        for f in futures:
            try:
                f.result()
            except Exception:  # noqa: BLE001 (the server is gone)
                pass
    bad = []
    for name in os.listdir(args.dir):
        if name.endswith(".safetensors"):
            try:
                _tokens(safe_open, os.path.join(args.dir, name))
            except Exception as exc:  # noqa: BLE001
                bad.append(f"{name}: {exc}")
    parts = [n for n in os.listdir(args.dir) if n.endswith(".part")]
    return {"partial_under_final_name": bad, "parts_left_for_the_sweep": len(parts)}


def check_swept(args: argparse.Namespace) -> dict:
    parts = [n for n in os.listdir(args.dir) if n.endswith(".part")]
    return {"parts_left": parts}


MODEL = os.environ.get("MODEL", "")


def main() -> int:
    global MODEL
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("check", choices=("ids", "bad", "load", "kill", "swept"))
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--dir", required=True, help="the server's shared_storage_path")
    parser.add_argument("--model", default=MODEL, help="the served model name")
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=1000, help="load: ids below this")
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--pid", type=int, default=0, help="the server's process group")
    parser.add_argument("--after", type=float, default=3.0, help="kill: seconds under load")
    args = parser.parse_args()
    MODEL = args.model
    found = {
        "ids": check_ids,
        "bad": check_bad,
        "load": check_load,
        "kill": check_kill,
        "swept": check_swept,
    }[args.check](args)
    print(json.dumps(found))
    broken = {
        "ids": not found.get("ok", True),
        "load": found.get("whole_and_right") != found.get("requests")
        or found.get("distinct_files") != found.get("requests"),
        "kill": bool(found.get("partial_under_final_name")),
        "swept": bool(found.get("parts_left")),
        "bad": not found.get("alive_after", True),
    }[args.check]
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
