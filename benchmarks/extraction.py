"""Hidden-state extraction against plain prefill on one GPU: tokens/s, KV capacity, file bytes.

For a non-hybrid control (Qwen3 layout) and a hybrid (Qwen3.5 layout, `models.PRESETS`), both
built here with random weights (the real size, `qwen3.6-27b`: the published Qwen3.6-27B config's
text model, config.json only and vLLM's dummy weights, no tokenizer; `qwen3.6-27b-bf16-state`:
the same with the GDN state in bf16, the look-alike the dated results of 2026-11-29 to 2026-12-06
ran, also accepted by its old name `qwen3.6-27b-like`), each engine in a fresh process (clean
GPU memory):

- plain:   `LLM.generate` on token-id prompts, `max_tokens=1`, no extraction;
- extract: the same with speculators' `speculative_config` + `kv_transfer_config`
           (`extraction.extraction_args`), timed until `generate` returns and until every
           file is complete (see `engine.py`);
- extract-instep: extract with SPECULATORS_HYBRID_ASYNC_WRITES=0 (files written in the step);
- extract-nofiles: extract with the file path cut off (benchmarks/nofiles.py, vLLM < 0.22);
- extract-timeline: extract with each file's submit/copy/write times and the engine thread's
  time in the step's parts (benchmarks/timeline.py; timeline_upstream.py for vLLM's
  own connector, >= 0.24), summed up per pass in the JSON;
- extract-wide / extract-onelayer: extract with SPECULATORS_HYBRID_WIDE_HIDDEN=1 / =0 (the
  hidden states in one group as wide as the model's, the default on vLLM < 0.22 with prefix
  caching off, or in one-layer groups);
- extract-prefill-only: extract with SPECULATORS_HYBRID_PREFILL_ONLY=1 (no spare state block);
- extract-accepted-wait: extract with vLLM's accepted-count wait kept (vLLM 0.20-0.23:
  SPECULATORS_HYBRID_DISABLED_PATCHES=no-accepted-count-wait-in-prefill), to measure that patch;
- extract-save-file: extract with the files written by safetensors' `save_file`
  (SPECULATORS_HYBRID_SAFETENSORS_SAVE=1), to measure our GIL-free writer against it;
- extract-paced: extract with each file's host copy paced in 8 MiB pieces
  (SPECULATORS_HYBRID_COPY_CHUNK_MIB=8, vLLM < 0.22), to measure the pacing against extract;
  extract-paced2: the same in 2 MiB pieces;
- extract-copy-at-queue: extract with each file's copy waiting for all work launched until the
  step that queues it, as vLLM >= 0.24 makes it wait
  (SPECULATORS_HYBRID_DISABLED_PATCHES=hidden-states-copy-when-ready), against extract.

Workloads: `fixed` (N prompts x L tokens), `chat` (N prompts, seeded log-uniform lengths
of 100-8,000 tokens) or `shared-prefix` (N prompts x L tokens whose first `--shared-prefix-len`
tokens, 1,000 by default, are the same in a pass: a shared system prompt; each pass has its own).

Same prompts, prefix caching off unless `--prefix-caching on` (the JSON records whether the
engine kept it on: the plugin turns it off for hybrid extraction where it is not proven),
CUDA graphs on where they start (`--cuda-graphs auto` falls
back to eager and says so), warm-up before timing, the KV size fixed (`--kv-cache-gib`) so
"GPU KV cache size: N tokens" from vLLM's start-up log compares the two. One JSON per engine
in `--out`, and a markdown table of every run found there (`--table-only` reprints it).

    python benchmarks/extraction.py --out /tmp/bench          # the plugin as installed
    SPECULATORS_HYBRID_DISABLE=1 python benchmarks/extraction.py --out /tmp/bench  # --plugin off
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT / "tests" / "gpu", ROOT):  # the GPU test's tokenizer helper; this checkout
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from benchmarks import engine, trace_gaps  # noqa: E402
from speculators_hybrid import switches  # noqa: E402
from speculators_hybrid.models import ALIASES, PRESETS, deprecation  # noqa: E402
from speculators_hybrid.switches import (  # noqa: E402
    ASYNC_WRITES,
    DISABLE,
    DISABLED_PATCHES,
    SAFETENSORS_SAVE,
)
from speculators_hybrid.switches import COPY_CHUNK_MIB as COPY_CHUNK  # noqa: E402
from speculators_hybrid.versions import installed  # noqa: E402


def control_sizes(size: str) -> dict[str, int]:
    """A non-hybrid control (Qwen3 layout) as wide and deep as the hybrid preset `size`."""
    p = PRESETS[size]
    head_dim = 128 if p["hidden_size"] >= 1024 else 64
    heads = p["hidden_size"] // head_dim
    return dict(
        layers=p["layers"],
        hidden_size=p["hidden_size"],
        intermediate_size=p["intermediate_size"],
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 4),
        head_dim=head_dim,
        vocab_size=p["vocab_size"],
    )


KINDS = ("control", "hybrid")
SIZES = ("wide-8l", "tiny", "qwen3.6-27b", "qwen3.6-27b-bf16-state")
# config.json only; the others: checkpoint + local tokenizer
DUMMY_SIZES = ("qwen3.6-27b", "qwen3.6-27b-bf16-state")
MODES = (
    "plain",
    "extract",
    "extract-instep",
    "extract-nofiles",
    "extract-timeline",
    "extract-wide",
    "extract-onelayer",
    "extract-prefill-only",
    "extract-accepted-wait",
    "extract-save-file",
    "extract-paced",
    "extract-paced2",
    "extract-copy-at-queue",
)
# The environment each extraction mode adds to the engine's (the opt-in switches of the plugin).
MODE_ENV: dict[str, dict[str, str]] = {
    "extract-instep": {ASYNC_WRITES: "0"},  # files written inside the step
    "extract-wide": {switches.WIDE_HIDDEN: "1"},  # vllm_patches/wide_hidden.py
    "extract-onelayer": {switches.WIDE_HIDDEN: "0"},  # one-layer KV-cache groups
    "extract-prefill-only": {switches.PREFILL_ONLY: "1"},  # no spare state block
    # vLLM's accepted-count wait kept (vLLM 0.20-0.23)
    "extract-accepted-wait": {DISABLED_PATCHES: "no-accepted-count-wait-in-prefill"},
    "extract-save-file": {SAFETENSORS_SAVE: "1"},  # safetensors' save_file writes the files
    "extract-paced": {COPY_CHUNK: "8"},  # host copies paced in 8 MiB pieces
    "extract-paced2": {COPY_CHUNK: "2"},  # in 2 MiB pieces
    # vLLM >= 0.24: each copy waits for all work launched until the step that queues it
    "extract-copy-at-queue": {DISABLED_PATCHES: "hidden-states-copy-when-ready"},
}
WORKLOADS = ("fixed", "chat", "shared-prefix")
SHARED_PREFIX = 1000  # tokens of the shared-prefix workload's common system prompt
SHARED_PROMPT = 2000  # its prompts' length unless --prompt-len is given
CHAT_LENGTHS = (100, 8000)  # the chat mix: log-uniform prompt lengths in this range
CHAT_SEED = 0  # the same mix for every engine
KIND = "extraction-benchmark-run"

# Defaults of the settings that depend on the size (`parse_args` fills those not given).
DEFAULTS: dict[str, Any] = dict(
    prompts=64,
    prompt_len=512,
    repeats=3,
    warmup=1,
    max_num_batched_tokens=16384,
    max_model_len=4096,
    kv_cache_gib=8.0,
    engine_timeout=300.0,
    file_timeout=20.0,
)
# One H200 (141 GB): ~54 GB of bf16 weights + 20 GiB of KV; chat prompts up to 8,000 tokens.
REAL_SIZE_DEFAULTS = dict(
    DEFAULTS,
    prompt_len=2048,
    repeats=2,
    max_model_len=8192,
    kv_cache_gib=20.0,
    engine_timeout=480.0,  # a 27B start with torch.compile and CUDA graphs
    file_timeout=120.0,  # ~5 GB of files per pass
)
SIZE_DEFAULTS: dict[str, dict[str, Any]] = {size: REAL_SIZE_DEFAULTS for size in DUMMY_SIZES}


def prompt_lengths(workload: str, count: int, length: int, seed: int = CHAT_SEED) -> list[int]:
    """`count` x `length` (fixed, shared-prefix), or `count` seeded log-uniform lengths in
    CHAT_LENGTHS (chat)."""
    if workload != "chat":  # fixed, shared-prefix
        return [length] * count
    rng, (lo, hi) = random.Random(seed), CHAT_LENGTHS
    return [round(math.exp(rng.uniform(math.log(lo), math.log(hi)))) for _ in range(count)]


def workload_info(workload: str, lengths: list[int]) -> dict[str, Any]:
    """What the JSON records of a workload's prompt lengths."""
    ordered = sorted(lengths)
    info = dict(
        name=workload,
        prompts=len(lengths),
        total_tokens=sum(lengths),
        min=ordered[0],
        median=ordered[len(ordered) // 2],
        max=ordered[-1],
    )
    if workload == "chat":
        info["mix"] = f"log-uniform {CHAT_LENGTHS[0]}-{CHAT_LENGTHS[1]} tokens, seed {CHAT_SEED}"
    return info


def layer_ids(n: int) -> list[int]:
    """speculators' default ids: [2, n//2, n-3, n]."""
    return sorted({2, n // 2, n - 3, n})


def model_info(kind: str, size: str) -> dict[str, Any]:
    """What the table and the engine need to know of a model, without building it."""
    if kind == "control":
        c = control_sizes(size)
        layers, what = c["layers"], f"Qwen3 layout, {c['layers']} attention layers"
    else:
        c = PRESETS[size]
        layers = c["layers"]
        what = f"Qwen3.5 layout, {layers - layers // 4} GDN + {layers // 4} attention layers"
    what = f"{what}, hidden {c['hidden_size']}"
    if kind == "hybrid" and "mamba_ssm_dtype" in c:  # else the model's dtype (bf16)
        what += f", GDN state {c['mamba_ssm_dtype']}"
    if size in DUMMY_SIZES:
        what += f", vocab {c['vocab_size']:,}, vLLM dummy weights"
    return dict(
        kind=kind,
        size=size,
        hybrid=kind == "hybrid",
        multimodal=kind == "hybrid",  # vLLM 0.20.1 serves Qwen3.5 only in the multimodal layout
        hidden=c["hidden_size"],
        layers=layers,
        vocab=c["vocab_size"],
        layer_ids=layer_ids(layers),
        describe=what,
    )


def build_model(kind: str, size: str, work: Path, device: str) -> None:
    """Random-weight checkpoint (bf16) and a local tokenizer, or for DUMMY_SIZES config.json
    only (the engine loads vLLM's dummy weights and needs no tokenizer); in its own process."""
    import transformers

    from speculators_hybrid.models import hf_config, save_random_model, write_config

    info, folder = model_info(kind, size), model_folder(work, kind, size)
    if kind == "hybrid" and size in DUMMY_SIZES:
        write_config(folder, size, multimodal=True)
        (folder / "built.json").write_text(json.dumps(info))
        return
    if kind == "hybrid":
        cls, config = transformers.Qwen3_5ForConditionalGeneration, hf_config(size, True)
    else:
        sizes = {k: v for k, v in control_sizes(size).items() if k != "layers"}
        cls = transformers.Qwen3ForCausalLM
        config = transformers.Qwen3Config(
            num_hidden_layers=info["layers"],
            max_position_embeddings=32768,
            eos_token_id=0,
            pad_token_id=0,
            bos_token_id=None,
            tie_word_embeddings=False,
            **sizes,
        )
    if size in DUMMY_SIZES:
        config.dtype = "bfloat16"
        config.save_pretrained(folder)
    else:
        from hf_reference import write_tokenizer

        save_random_model(folder, cls, config, device=device)
        write_tokenizer(folder, info["vocab"])
    (folder / "built.json").write_text(json.dumps(info))


def model_folder(work: Path, kind: str, size: str) -> Path:
    return work / "models" / f"{kind}-{size}"


def ensure_models(kinds: list[str], size: str, work: Path, device: str) -> None:
    """Build the models this work dir does not hold yet, in one process of its own."""
    missing = []
    for kind in kinds:
        marker = model_folder(work, kind, size) / "built.json"
        if not (marker.exists() and json.loads(marker.read_text()) == model_info(kind, size)):
            missing.append(kind)
    if missing:
        t = time.perf_counter()
        cmd = [sys.executable, __file__, "--build", size, str(work), device, *missing]
        subprocess.run(cmd, check=True)
        print(f"built {', '.join(missing)} ({size}) in {time.perf_counter() - t:.0f} s", flush=True)


KV_TOKENS = re.compile(r"GPU KV cache size: ([\d,]+) tokens")
CONCURRENCY = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")
PLUGIN = re.compile(r"speculators-hybrid: pid=\d+ role=(\S+) vllm=(\S+) patches=(\S*)")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
NOTABLE = re.compile(
    r"speculators-hybrid|GPU KV cache size|Maximum concurrency|ERROR|Error|bench-engine"
)


def parse_log(text: str) -> dict[str, Any]:
    """KV capacity and our plugin's state from an engine's log (every process writes to it)."""
    text = ANSI.sub("", text)
    tokens = [int(m.replace(",", "")) for m in KV_TOKENS.findall(text)]
    concurrency = [float(m[1]) for m in CONCURRENCY.findall(text)]
    loads = PLUGIN.findall(text)
    patches = sorted({p for *_, ids in loads for p in ids.split(",") if p and p != "none"})
    if loads:
        state = "active" if patches else "loaded, no patch for this vLLM"
    elif "disabled by SPECULATORS_HYBRID_DISABLE" in text:
        state = "disabled"
    else:
        state = "not loaded"
    return {
        "kv_cache_tokens": min(tokens) if tokens else None,
        "max_concurrency": min(concurrency) if concurrency else None,
        "plugin": {"state": state, "patches": patches, "roles": sorted({r for r, *_ in loads})},
    }


def engine_env(plugin: str, mode: str = "plain") -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", VLLM_USE_FLASHINFER_SAMPLER="0")
    # Engine core in its own process (vLLM's default); in-process, files come one step late.
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    env.pop(DISABLE, None)  # the flag decides
    if plugin == "off":
        env[DISABLE] = "1"
    env.update(MODE_ENV.get(mode, {}))
    if mode in engine.CONNECTORS:  # the engine core imports benchmarks.*
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def run_engine(spec: dict[str, Any], runs: Path, plugin: str, timeout_s: float) -> dict[str, Any]:
    """`engine.main` in a new session; the whole process group is killed when it ends."""
    spec_path = runs / f"{spec['name']}.spec.json"
    spec_path.write_text(json.dumps(spec, indent=1))
    result, log = Path(spec["result"]), runs / f"{spec['name']}.log"
    result.unlink(missing_ok=True)
    with open(log, "wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, __file__, "--engine", str(spec_path)],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=engine_env(plugin, spec["mode"]),
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout_s
        try:
            while proc.poll() is None and time.monotonic() < deadline:
                time.sleep(1)
                if result.exists():  # done; a hung shutdown gets 30 s
                    deadline = min(deadline, time.monotonic() + 30)
            timed_out = proc.poll() is None and not result.exists()
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
    text = log.read_text(errors="replace")
    data = json.loads(result.read_text()) if result.exists() else {}
    if not data:
        how = f"timed out after {timeout_s:.0f} s" if timed_out else f"exited {proc.returncode}"
        lines = text.strip().splitlines()
        cause = [ln for ln in lines if re.search(r"Error|Exception|error:", ln)][:20]
        data = {"error": f"engine {how}; log tail:\n" + "\n".join(lines[-30:])}
        data["error_lines"] = cause  # the engine core's root cause sits above the tail
        data["timed_out"] = timed_out
    notable = [line for line in text.splitlines() if NOTABLE.search(line)]
    return {**data, **parse_log(text), "log": str(log), "log_lines": notable[:60]}


def our_version() -> str:
    version = installed("speculators-hybrid") or "not installed"
    git = subprocess.run(
        ["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True, text=True
    )
    return f"{version} ({git.stdout.strip()})" if git.returncode == 0 else version


def storage_fs(path: Path) -> str:
    """Filesystem type under `path` (the files' destination), from /proc/mounts."""
    best, fs = "", "unknown"
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            _, mount, kind, *_ = line.split()
            inside = str(path) == mount or str(path).startswith(mount.rstrip("/") + "/")
            if inside and len(mount) > len(best):
                best, fs = mount, kind
    except OSError:
        pass
    return fs


def run_name(args: argparse.Namespace, kind: str, mode: str) -> str:
    vllm = installed("vllm") or "-none"
    cached = "-prefix-caching" if args.prefix_caching == "on" else ""
    return f"vllm{vllm}-plugin-{args.plugin}-{kind}-{args.size}-{args.workload}{cached}-{mode}"


def run_one(args: argparse.Namespace, kind: str, mode: str) -> dict[str, Any]:
    info, folder = model_info(kind, args.size), model_folder(args.work, kind, args.size)
    name = run_name(args, kind, mode)
    lengths = prompt_lengths(args.workload, args.prompts, args.prompt_len)
    storage, runs = args.work / "hidden_states" / name, args.work / "runs"
    storage.mkdir(parents=True, exist_ok=True)
    runs.mkdir(parents=True, exist_ok=True)
    if args.profile:
        (args.work / "profiles" / name).mkdir(parents=True, exist_ok=True)
    spec = dict(
        name=name,
        mode=mode,
        folder=str(folder),
        **{k: info[k] for k in ("hybrid", "multimodal", "hidden", "vocab", "layer_ids")},
        dummy=args.size in DUMMY_SIZES,
        workload=args.workload,
        prompts=args.prompts,
        prompt_len=args.prompt_len if args.workload != "chat" else None,
        shared_prefix=args.shared_prefix_len if args.workload == "shared-prefix" else 0,
        prefix_caching=args.prefix_caching == "on",
        lengths=lengths,
        repeats=args.repeats,
        warmup=args.warmup,
        storage=str(storage),
        result=str(runs / f"{name}.engine.json"),
        eager=args.cuda_graphs == "off",
        kv_cache_bytes=int(args.kv_cache_gib * 2**30),
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        file_timeout_s=args.file_timeout,
        profile_dir=str(args.work / "profiles" / name) if args.profile else None,
    )
    t = time.perf_counter()
    data = run_engine(spec, runs, args.plugin, args.engine_timeout)
    graphs_error = None
    if "error" in data and not data["timed_out"] and args.cuda_graphs == "auto":
        graphs_error = data["error"] + "\n" + "\n".join(data.get("error_lines", []))
        print(f"{name}: did not run with CUDA graphs; again in eager mode", flush=True)
        spec["eager"] = True
        data = run_engine(spec, runs, args.plugin, args.engine_timeout)
    env = engine_env(args.plugin, mode)  # the engine's environment, as run_engine gave it
    run = {
        "kind": KIND,
        "date": time.strftime("%Y-%m-%d"),
        "vllm": installed("vllm"),
        **data,
        "name": name,
        "model": info,
        "mode": mode,
        "workload": workload_info(args.workload, lengths),
        "settings": {k: v for k, v in spec.items() if k not in ("name", "result", "folder")},
        "storage_fs": storage_fs(storage),
        "cuda_graphs_error": graphs_error,
        "speculators_hybrid": our_version(),
        "plugin_flag": args.plugin,
        DISABLE: env.get(DISABLE),
        ASYNC_WRITES: env.get(ASYNC_WRITES),  # as the engine had it
        "switches": {k: v for k, v in env.items() if k.startswith("SPECULATORS_")},
        "wall_s": time.perf_counter() - t,
    }
    table = Path(spec["profile_dir"] or "-") / "profiler_out_0.txt"
    if table.exists():
        shutil.copyfile(table, args.out / f"{name}.profile.txt")
    if spec["profile_dir"]:  # where the GPU waited in the profiled pass (benchmarks/trace_gaps.py)
        run["profile_gaps"] = trace_gaps.of_folder(Path(spec["profile_dir"]))
    if run.get("kv_cache_tokens"):
        run["kv_bytes_per_token"] = spec["kv_cache_bytes"] / run["kv_cache_tokens"]
    (args.out / f"{name}.json").write_text(json.dumps(run, indent=1) + "\n")
    return run


# ---------------------------------------------------------------- table


def load_runs(out: Path) -> list[dict[str, Any]]:
    runs = []
    for path in sorted(out.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except ValueError:
            continue
        if isinstance(data, dict) and data.get("kind") == KIND:
            runs.append(data)
    return runs


def _num(x: float | None, fmt: str = ",.0f") -> str:
    return "n/a" if x is None else format(x, fmt)


def _ratio(a: float | None, b: float | None) -> str:
    return "n/a" if not a or not b else f"{a / b:.2f}"


def workload_text(run: dict[str, Any]) -> str:
    s, w = run["settings"], run.get("workload")
    if not w or w["name"] == "fixed":
        return f"{s['prompts']}x{s['prompt_len']} tok"
    if w["name"] == "shared-prefix":
        return f"{s['prompts']}x{s['prompt_len']} tok sharing a {s['shared_prefix']}-tok prefix"
    lo, hi = CHAT_LENGTHS
    return f"chat mix {w['prompts']} prompts {lo}-{hi} tok (total {w['total_tokens']:,})"


def settings_text(run: dict[str, Any]) -> str:
    s = run["settings"]
    graphs = "eager" if s["eager"] else "CUDA graphs"
    if run.get("cuda_graphs_error"):
        graphs = "eager (graphs failed)"
    writes = run.get(ASYNC_WRITES)
    return (
        f"{workload_text(run)}, {s['repeats']} passes, {graphs}, "
        f"batch {s['max_num_batched_tokens']}, KV {s['kv_cache_bytes'] / 2**30:g} GiB, "
        f"{caching_text(run)}, ids {','.join(map(str, s['layer_ids']))}, "
        f"files on {run['storage_fs']}"
        + (", async writes" if writes in ("1", "true", "yes") else "")
        + (f", in-step writes ({ASYNC_WRITES}=0)" if writes == "0" else "")
    )


def caching_text(run: dict[str, Any]) -> str:
    """Prefix caching as asked for, and as the engine had it when that differs."""
    asked = bool(run["settings"].get("prefix_caching"))
    kept = run.get("prefix_caching_in_engine", asked)
    if asked and not kept:
        return "prefix caching asked, off in the engine"
    return f"prefix caching {'on' if asked else 'off'}"


def _cpu(run: dict[str, Any]) -> str:
    return _num(run.get("engine_cpu_ms_per_step_est"), ",.1f")


def table(runs: list[dict[str, Any]]) -> str:
    """One row per (vLLM, plugin flag, model, workload) and extraction mode, beside its plain."""
    groups: dict[tuple, dict[str, dict[str, Any]]] = {}
    for run in runs:
        workload = (run.get("workload") or {}).get("name", "fixed")
        model = run["model"]
        key = (
            str(run["vllm"]),
            run["plugin_flag"],
            model["kind"],
            model.get("size", "?"),
            workload,
            bool(run["settings"].get("prefix_caching")),
        )
        groups.setdefault(key, {})[run["mode"]] = run
    head = (
        "| date | GPU | vLLM | speculators-hybrid (plugin) | model | settings | mode "
        "| plain tok/s | extraction tok/s (returned / files) | ratio (returned / files) "
        "| KV tokens plain / extraction (ratio) | KV bytes/token plain / extraction "
        "| file bytes/token | files GB/s | engine CPU ms/step plain / extraction (est.) |"
    )
    lines = [head, "|" + "---|" * 15]
    for key in sorted(groups):
        plain = groups[key].get("plain", {})
        extracting = [m for m in MODES if m != "plain" and m in groups[key]]
        for mode in extracting or ["plain only"]:
            lines.append(row(key[0], plain, groups[key].get(mode, {}), mode))
    return "\n".join(lines)


def row(vllm: str, plain: dict[str, Any], ext: dict[str, Any], mode: str) -> str:
    any_run = ext or plain
    p_rate = plain.get("tokens_per_s_returned")
    e_ret, e_files = ext.get("tokens_per_s_returned"), ext.get("tokens_per_s_files")
    kv_p, kv_e = plain.get("kv_cache_tokens"), ext.get("kv_cache_tokens")
    plugin = ext.get("plugin") or plain.get("plugin") or {}
    state = plugin.get("state", "?")
    if plugin.get("patches"):
        state += ": " + ", ".join(plugin["patches"])
    errors = [r["name"] for r in (plain, ext) if r.get("error")]
    model = f"{any_run['model']['kind']}: {any_run['model']['describe']}"
    if errors:
        model += f" (FAILED: {', '.join(errors)})"
    cells = [
        any_run.get("date", "?"),
        any_run.get("gpu", "?"),
        vllm,
        f"{any_run['speculators_hybrid']} ({state})",
        model,
        settings_text(any_run),
        mode,
        _num(p_rate),
        f"{_num(e_ret)} / {_num(e_files)}",
        f"{_ratio(e_ret, p_rate)} / {_ratio(e_files, p_rate)}",
        f"{_num(kv_p)} / {_num(kv_e)} ({_ratio(kv_e, kv_p)})",
        f"{_num(plain.get('kv_bytes_per_token'))} / {_num(ext.get('kv_bytes_per_token'))}",
        _num(ext.get("file_bytes_per_token")),
        _num(ext.get("files_gb_per_s"), ".2f"),
        f"{_cpu(plain)} / {_cpu(ext)}",
    ]
    return "| " + " | ".join(cells) + " |"


# ---------------------------------------------------------------- command line


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("bench-out"), help="JSON, logs, table")
    ap.add_argument(
        "--work", type=Path, default=Path("/tmp/spec-hybrid-bench"), help="models and files"
    )
    ap.add_argument("--models", nargs="+", choices=KINDS, default=list(KINDS))
    ap.add_argument("--modes", nargs="+", choices=MODES, default=["plain", "extract"])
    ap.add_argument(
        "--size",
        choices=SIZES + tuple(ALIASES),
        default=SIZES[0],
        help="models.PRESETS entry",
    )
    ap.add_argument("--workload", choices=WORKLOADS, default="fixed")
    ap.add_argument(
        "--shared-prefix-len",
        type=int,
        default=SHARED_PREFIX,
        help=f"shared-prefix workload: tokens all prompts of a pass share ({SHARED_PREFIX})",
    )
    ap.add_argument(
        "--prefix-caching",
        choices=("on", "off"),
        default="off",
        help="vLLM's prefix caching for every engine (default off)",
    )
    per_size = "default: per --size (SIZE_DEFAULTS)"
    ap.add_argument("--prompts", type=int, help=per_size)
    ap.add_argument("--prompt-len", type=int, help=f"fixed workload; {per_size}")
    ap.add_argument("--repeats", type=int, help=f"timed passes (median); {per_size}")
    ap.add_argument("--warmup", type=int, help=f"untimed passes first; {per_size}")
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--max-num-batched-tokens", type=int, help=per_size)
    ap.add_argument("--max-model-len", type=int, help=per_size)
    ap.add_argument("--kv-cache-gib", type=float, help=f"same for every engine; {per_size}")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    ap.add_argument(
        "--cuda-graphs",
        choices=("auto", "on", "off"),
        default="auto",
        help="auto: graphs, falling back to eager if the engine does not run",
    )
    ap.add_argument(
        "--plugin",
        choices=("on", "off"),
        default="off" if os.environ.get(DISABLE) == "1" else "on",
        help=f"off: {DISABLE}=1 in the engines (default: from that variable)",
    )
    ap.add_argument("--engine-timeout", type=float, help=f"seconds per engine; {per_size}")
    ap.add_argument("--file-timeout", type=float, help=f"seconds to wait for files; {per_size}")
    ap.add_argument("--build-device", default="cuda", help="where to init the random weights")
    ap.add_argument(
        "--profile",
        action="store_true",
        help="one more pass per engine under vLLM's torch profiler; its kernel table is copied "
        "to --out as <run>.profile.txt",
    )
    ap.add_argument("--table-only", action="store_true", help="print the table of --out")
    ap.add_argument("--engine", help=argparse.SUPPRESS)  # internal: one engine, from a spec
    ap.add_argument("--build", nargs="+", help=argparse.SUPPRESS)  # internal: SIZE WORK DEVICE..
    args = ap.parse_args(argv)
    if args.size in ALIASES:  # the dated results' commands
        print(f"extraction.py: {deprecation(args.size)}", file=sys.stderr)
        args.size = ALIASES[args.size]
    if args.workload == "shared-prefix" and args.prompt_len is None:
        args.prompt_len = SHARED_PROMPT  # the 64 x 2,000 tokens, 1,000 of them shared
    for key, value in SIZE_DEFAULTS.get(args.size, DEFAULTS).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    longest = args.prompt_len if args.workload != "chat" else CHAT_LENGTHS[1]
    if args.workload == "shared-prefix" and not 0 < args.shared_prefix_len < args.prompt_len:
        ap.error(
            f"--shared-prefix-len must be between 1 and --prompt-len - 1 ({args.prompt_len - 1})"
        )
    if longest + 1 > args.max_model_len:
        ap.error(f"--max-model-len must exceed the longest prompt ({longest} tokens)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.engine:
        engine.main(args.engine)
        return 0
    if args.build:
        size, work, device, *kinds = args.build
        for kind in kinds:
            build_model(kind, size, Path(work), device)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    failed = 0
    # device.sh's `timeout` sends SIGTERM: exit through run_engine's `finally`, which kills the
    # engine's process group (by default Python dies at once and the engine keeps the GPU).
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    if not args.table_only:
        args.out, args.work = args.out.resolve(), args.work.resolve()
        start = time.perf_counter()
        ensure_models(args.models, args.size, args.work, args.build_device)
        for kind in args.models:
            for mode in args.modes:
                run = run_one(args, kind, mode)
                failed += "error" in run
                rate = run.get("tokens_per_s_returned")
                print(f"{run['name']}: {_num(rate)} tok/s, KV {run['kv_cache_tokens']} tokens")
        print(f"benchmark wall time {time.perf_counter() - start:.0f} s", flush=True)
    text = table(load_runs(args.out))
    (args.out / "table.md").write_text(text + "\n")
    print(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
