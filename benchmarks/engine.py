"""One vLLM engine of the extraction benchmark, run in a fresh process by `extraction.py`.

Plain mode runs the prompts with `max_tokens=1`; the extract modes add speculators' settings
(`extraction.extraction_args`). Each timed pass records when `generate` returned and, when
extracting, when every file was complete: present, its `<path>.lock` free, whole (size as
its safetensors header says) with `hidden_states.shape[0] == len(prompt)`. It also records
the CPU seconds of this process and of its children (the engine core), from /proc, until
then. Files are checked against the contract once (not timed), then deleted with their locks.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

POLL_S = 0.002
# Modes that run a benchmark-only connector (kv_connector, the module the engine core imports).
CONNECTORS = {
    "extract-nofiles": ("NoFilesConnector", "benchmarks.nofiles"),
    "extract-timeline": ("TimelineConnector", "benchmarks.timeline"),
}
UPSTREAM_TIMELINE = "benchmarks.timeline_upstream"  # the timeline of vLLM's connector (>= 0.22)
TIMELINE_SUFFIX = ".timeline.jsonl"  # timeline.SUFFIX (that module imports vLLM and torch)
CLK_TCK = os.sysconf("SC_CLK_TCK")


def extracts(mode: str) -> bool:
    return mode != "plain"  # extract, extract-instep, extract-nofiles, extract-timeline, ...


def writes_files(mode: str) -> bool:
    return extracts(mode) and mode != "extract-nofiles"


def make_prompts(lengths: list[int], vocab: int, seed: int, shared: int = 0) -> list[list[int]]:
    """Random token ids in 1..vocab-5 (0 is end-of-text, the last four are vision specials);
    the first `shared` tokens of every prompt are the same (a system prompt, per seed)."""
    rng = random.Random(seed)
    prefix = [rng.randrange(1, vocab - 4) for _ in range(shared)]
    return [
        prefix[:n] + [rng.randrange(1, vocab - 4) for _ in range(n - min(n, shared))]
        for n in lengths
    ]


def own_connector_gone() -> bool:
    """vLLM >= 0.22: hybrid extraction runs vLLM's own connector, not ours."""
    from speculators_hybrid.registry import base_version
    from speculators_hybrid.versions import installed

    return base_version(installed("vllm") or "0").release >= (0, 22)


def engine_kwargs(spec: dict[str, Any], fields: set[str]) -> dict[str, Any]:
    """`LLM(**kwargs)` for a run spec; `fields` are the installed `EngineArgs` field names."""
    from speculators_hybrid.extraction import extraction_args

    kwargs: dict[str, Any] = dict(
        model=spec["folder"],
        enforce_eager=spec["eager"],
        enable_prefix_caching=bool(spec.get("prefix_caching", False)),
        kv_cache_memory_bytes=spec["kv_cache_bytes"],
        gpu_memory_utilization=spec["gpu_memory_utilization"],
        max_num_seqs=spec["max_num_seqs"],
        max_num_batched_tokens=spec["max_num_batched_tokens"],
        max_model_len=spec["max_model_len"],
        seed=0,
    )
    if spec.get("dummy"):  # config.json only: random weights, no tokenizer (token-id prompts)
        kwargs.update(load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16")
    else:
        kwargs["tokenizer"] = spec["folder"]
    if extracts(spec["mode"]):
        kwargs.update(extraction_args(tuple(spec["layer_ids"]), spec["storage"]))
    if spec["mode"] in CONNECTORS:  # benchmarks/nofiles.py, timeline.py (import vLLM, torch)
        connector, module = CONNECTORS[spec["mode"]]
        if spec["mode"] == "extract-timeline" and own_connector_gone():
            module = UPSTREAM_TIMELINE
        transfer = kwargs["kv_transfer_config"]
        transfer.update(kv_connector=connector, kv_connector_module_path=module)
    if spec.get("profile_dir") and "profiler_config" in fields:  # --profile: one pass after
        kwargs["profiler_config"] = dict(
            profiler="torch",
            torch_profiler_dir=spec["profile_dir"],
            torch_profiler_with_stack=False,
        )
    if spec["multimodal"]:
        kwargs["language_model_only"] = True
    if spec["hybrid"] and "gdn_prefill_backend" in fields:
        kwargs["gdn_prefill_backend"] = "triton"  # FlashInfer is not staged on the device
    return kwargs


def header_rows(path: str) -> int | None:
    """`hidden_states` rows if `path` is a whole safetensors file (size as its header says)."""
    with open(path, "rb") as f:
        head = f.read(8)
        size = os.fstat(f.fileno()).st_size
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if not 0 < n <= size - 8:
            return None
        try:
            meta = json.loads(f.read(n))
            end = max(v["data_offsets"][1] for k, v in meta.items() if k != "__metadata__")
            rows = meta["hidden_states"]["shape"][0]
        except (ValueError, KeyError, TypeError, IndexError):
            return None
    return rows if size == 8 + n + end else None


def file_complete(path: str, tokens: int) -> bool:
    """The file is there, nobody holds its lock, and it is whole with `tokens` rows."""
    if not os.path.exists(path):
        return False
    try:
        fd = os.open(f"{path}.lock", os.O_RDONLY)
    except FileNotFoundError:
        fd = -1
    try:
        if fd >= 0:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # the writer holds LOCK_EX
        return header_rows(path) == tokens
    except OSError:  # lock held, or the file went away
        return False
    finally:
        if fd >= 0:
            os.close(fd)


def wait_for_files(expected: dict[str, int], timeout_s: float) -> tuple[float, list[str]]:
    """Poll until every file is complete; (monotonic time the last one was, still missing)."""
    pending = dict(expected)
    last = time.perf_counter()
    deadline = last + timeout_s
    while pending and time.perf_counter() < deadline:
        for path in [p for p, n in pending.items() if file_complete(p, n)]:
            del pending[path]
            last = time.perf_counter()
        if pending:
            time.sleep(POLL_S)
    return last, sorted(pending)


def check_file(path: str, prompt: list[int], n_ids: int, hidden: int) -> str | None:
    """What is wrong with one file against the contract, or None."""
    import torch
    from safetensors.torch import load_file

    data = load_file(path)
    states, tokens = data.get("hidden_states"), data.get("token_ids")
    if states is None or tokens is None:
        return f"keys {sorted(data)}"
    if tuple(states.shape) != (len(prompt), n_ids, hidden):
        return f"shape {tuple(states.shape)}"
    if tokens.dtype != torch.int64 or tokens.tolist() != prompt:
        return "token_ids differ from the prompt"
    if not torch.isfinite(states).all():
        return "NaN/Inf"
    if (states == 0).all(dim=-1).any():
        return "all-zero rows"
    return None


def digest(path: str) -> dict[str, Any]:
    """One of the first pass's files, to tell two modes' files apart: the SHA-256 of its
    hidden-state bytes (equal = bit-identical), read through the safetensors header."""
    import hashlib

    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        entry = json.loads(f.read(n))["hidden_states"]
        start, end = entry["data_offsets"]
        f.seek(8 + n + start)
        raw = f.read(end - start)
    return {"sha256": hashlib.sha256(raw).hexdigest(), "shape": entry["shape"]}


def clear(folder: str) -> None:
    """Delete the files (and their locks) of a pass."""
    for path in Path(folder).iterdir():
        path.unlink(missing_ok=True)


def cpu_seconds(root: int) -> dict[int, float]:
    """User + system CPU seconds of `root` and each of its descendants, from /proc/<pid>/stat."""
    parent, cpu = {}, {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (comm)"
        except (OSError, IndexError):
            continue  # gone meanwhile
        pid = int(stat.parent.name)
        parent[pid], cpu[pid] = int(fields[1]), (int(fields[11]) + int(fields[12])) / CLK_TCK
    tree, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in cpu:
            tree[pid] = cpu[pid]
            todo += [child for child, p in parent.items() if p == pid]
    return tree


def cpu_used(before: dict[int, float], root: int) -> dict[str, float]:
    """CPU seconds since `before`: this process (front end) and its children (engine core)."""
    after = cpu_seconds(root)
    used = {pid: s - before.get(pid, 0.0) for pid, s in after.items()}
    return {"frontend": used.pop(root, 0.0), "engine": sum(used.values())}


def sampling() -> Any:
    from vllm import SamplingParams

    return SamplingParams(max_tokens=1, detokenize=False)  # no tokenizer needed


def timeline(log: Path, wall0: float, returned: float) -> dict[str, Any] | None:
    """With extract-timeline: each file's times (benchmarks/timeline.py) as seconds into the
    pass, summed up: when the last file was submitted, copied and written, and how long the
    files waited for a writer thread, for their copy and for their write; and the engine
    thread's time in each timed call (`host`: calls, total and largest seconds)."""
    if not log.exists():
        return None
    lines = [json.loads(line) for line in log.read_text().splitlines() if line]
    log.unlink()
    rows = [r for r in lines if "call" not in r]
    if not rows or any(r["submitted"] is None for r in rows):
        return None
    host: dict[str, dict[str, Any]] = {}
    for r in lines:
        if "call" in r:
            h = host.setdefault(r["call"], dict(calls=0, total_s=0.0, max_s=0.0))
            h.update(
                calls=h["calls"] + 1,
                total_s=h["total_s"] + r["host_s"],
                max_s=max(h["max_s"], r["host_s"]),
            )

    def last(key: str) -> float:
        return max(r[key] for r in rows) - wall0

    def mean(a: str, b: str) -> float:
        return statistics.mean(r[b] - r[a] for r in rows)

    return dict(
        files=len(rows),
        last_submitted_s=last("submitted"),
        last_copied_s=last("copied"),
        last_written_s=last("written"),
        returned_s=returned,
        mean_queue_s=mean("submitted", "started"),
        mean_copy_wait_s=mean("started", "copied"),
        mean_write_s=mean("copied", "written"),
        host=host,
    )


def one_pass(llm: Any, spec: dict[str, Any], prompts: list[list[int]]) -> dict[str, Any]:
    """Generate once; time the return and (extracting) the files; leave the files."""
    cpu0 = cpu_seconds(os.getpid())
    log = Path(spec["storage"].rstrip("/") + TIMELINE_SUFFIX)
    if spec["mode"] == "extract-timeline":
        log.unlink(missing_ok=True)  # an earlier pass's, if it stopped before reading it
    wall0, t0 = time.time(), time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], sampling(), use_tqdm=False)
    returned = time.perf_counter() - t0
    tokens = sum(map(len, prompts))
    # Prefill only (max_tokens=1), chunked to the token budget: about this many engine steps.
    steps = math.ceil(tokens / spec["max_num_batched_tokens"])
    row: dict[str, Any] = {"tokens": tokens, "returned_s": returned, "steps_est": steps}
    if not writes_files(spec["mode"]):
        return {**row, "cpu_s": cpu_used(cpu0, os.getpid())}
    paths = [(o.kv_transfer_params or {}).get("hidden_states_path") for o in outputs]
    expected = {p: len(q) for p, q in zip(paths, prompts, strict=True) if p}
    done, missing = wait_for_files(expected, spec["file_timeout_s"])
    row["cpu_s"] = cpu_used(cpu0, os.getpid())  # until the files are complete
    if missing:  # a writer that waits for another engine step: give it one, say so
        llm.generate([{"prompt_token_ids": prompts[0][:16]}], sampling(), use_tqdm=False)
        _, missing = wait_for_files({p: expected[p] for p in missing}, spec["file_timeout_s"])
        row["needed_another_step"] = True
    timed = not missing and "needed_another_step" not in row and None not in paths
    file_bytes = sum(os.path.getsize(p) for p in expected if os.path.exists(p))
    row.update(
        files_s=done - t0 if timed else None,
        paths=paths,
        without_path=paths.count(None),
        incomplete=len(missing),
        file_bytes=file_bytes,
        files_gb_per_s=file_bytes / (done - t0) / 1e9 if timed else None,
    )
    if spec["mode"] == "extract-timeline":
        row["timeline"] = timeline(log, wall0, returned)
    return row


def median_rate(rows: list[dict[str, Any]], key: str) -> float | None:
    rates = [r["tokens"] / r[key] for r in rows if r.get(key)]
    return statistics.median(rates) if len(rates) == len(rows) else None


def median_of(rows: list[dict[str, Any]], value: Any) -> float | None:
    """Median over the passes of `value(row)`; None if any pass has none."""
    values = [value(r) for r in rows]
    return statistics.median(values) if values and None not in values else None


def profile_pass(llm: Any, spec: dict[str, Any], prompts: list[list[int]]) -> dict[str, Any] | None:
    """With --profile: one more pass under vLLM's torch profiler (the engine core writes its
    kernel table, by self CUDA time, to `profile_dir`/profiler_out_0.txt); not in the rates."""
    if not spec.get("profile_dir"):
        return None
    llm.start_profile()
    row = one_pass(llm, spec, prompts)
    llm.stop_profile()
    clear(spec["storage"])
    row.pop("paths", None)
    return row


def run(spec: dict[str, Any]) -> dict[str, Any]:
    import dataclasses

    import torch
    import vllm
    from vllm import LLM
    from vllm.engine.arg_utils import EngineArgs

    fields = {f.name for f in dataclasses.fields(EngineArgs)}
    kwargs = engine_kwargs(spec, fields)
    print(f"bench-engine: vllm {vllm.__version__} pid {os.getpid()} kwargs {kwargs}", flush=True)
    t = time.perf_counter()
    llm = LLM(**kwargs)
    startup = time.perf_counter() - t
    cache = llm.llm_engine.vllm_config.cache_config  # blocks as the engine core reported them
    lengths, extracting = spec["lengths"], writes_files(spec["mode"])
    shared = int(spec.get("shared_prefix") or 0)
    for w in range(spec["warmup"]):
        one_pass(llm, spec, make_prompts(lengths, spec["vocab"], 1000 + w, shared))
        clear(spec["storage"])
    rows, problems, digests = [], [], []
    for r in range(spec["repeats"]):
        prompts = make_prompts(lengths, spec["vocab"], r, shared)
        row = one_pass(llm, spec, prompts)
        paths = row.pop("paths", [])
        if r == 0 and extracting:  # the contract, once, untimed
            for path, prompt in zip(paths, prompts, strict=True):
                if not path or not os.path.exists(path):
                    problems.append(f"{path}: no file")
                elif issue := check_file(path, prompt, len(spec["layer_ids"]), spec["hidden"]):
                    problems.append(f"{path}: {issue}")
            digests = [digest(p) for p in paths[:2] if p and os.path.exists(p)]
        clear(spec["storage"])
        rows.append(row)
        print(f"bench-engine: pass {r} {row}", flush=True)
    profiled = profile_pass(llm, spec, make_prompts(lengths, spec["vocab"], 99, shared))
    tokens = sum(r["tokens"] for r in rows)
    file_bytes = sum(r.get("file_bytes", 0) for r in rows)
    return {
        "date": time.strftime("%Y-%m-%d"),
        "gpu": torch.cuda.get_device_name(0),
        "vllm": vllm.__version__,
        "torch": torch.__version__,
        "startup_s": startup,
        "num_gpu_blocks": getattr(cache, "num_gpu_blocks", None),
        "block_size": cache.block_size,
        "prefix_caching_in_engine": bool(cache.enable_prefix_caching),  # after our plugin's say
        "passes": rows,
        "tokens_per_s_returned": median_rate(rows, "returned_s"),
        "tokens_per_s_files": median_rate(rows, "files_s") if extracting else None,
        "file_bytes_per_token": file_bytes / tokens if extracting else None,
        "files_gb_per_s": median_of(rows, lambda r: r.get("files_gb_per_s")),
        "cpu_s_per_pass": {
            k: median_of(rows, lambda r, k=k: r["cpu_s"][k]) for k in ("frontend", "engine")
        },
        "engine_cpu_ms_per_step_est": median_of(
            rows, lambda r: 1e3 * r["cpu_s"]["engine"] / r["steps_est"]
        ),
        "profiled_pass": profiled,
        "first_files": digests,
        "file_problems": problems[:10],
        "file_problem_count": len(problems),
    }


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    result = run(spec)
    out = Path(spec["result"])
    out.with_suffix(".tmp").write_text(json.dumps(result, indent=1))
    out.with_suffix(".tmp").rename(out)
    print("bench-engine: done", flush=True)
