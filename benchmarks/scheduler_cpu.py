"""The engine core's scheduler-side CPU per step for extraction, with and without the plugin.

vLLM's real Scheduler, KV cache manager and scheduler-side connector, built on the CPU for the
real-size preset's plan (planning.py), drive the benchmark's workload (64 x 2,048 random token
ids, 16,384 tokens a step, 20 GiB of KV, max_model_len 8,192); the model runner is stood in for
by its output (one sampled token per finished prompt; each finished request's save reported
done one step later where the connector holds its blocks for it). Timed: `schedule()` and
`update_from_output()` per step, wall and CPU. What it leaves out: the worker's side (block
tables, slot mappings and attention metadata per KV-cache group, the forward).

    python benchmarks/scheduler_cpu.py [--out FILE] [--passes 3]

One JSON to stdout (and FILE): per mode ("plain": no extraction; "plugin"; "upstream": extraction
without the plugin) the KV-cache groups, steps a pass, the prompts each step of a pass completes
(their files are written after it: the last busy step's after `generate` returns), the median ms
per step and ms per pass.
SPECULATORS_HYBRID_WIDE_HIDDEN=0 / =1 picks the hidden-state layout on vLLM 0.20-0.21.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PRESET = "qwen3.6-27b"
IDS = (2, 32, 61, 64)
KV_BYTES = 20 << 30


def build(folder: str, plugin: bool, ids: tuple[int, ...] | None) -> tuple[Any, Any, int]:
    """(scheduler, request maker, number of KV-cache groups) as the engine core makes them."""
    from speculators_hybrid import planning

    planning.patches(plugin, import_all=True)  # every target module in, as at an engine start
    setup = planning.Setup(
        model=folder, layer_ids=ids, max_model_len=8192, max_num_batched_tokens=16384
    )
    config = planning.engine_config(setup)
    kv = planning.plan(config, planning.layer_specs(config, wide=True), KV_BYTES)
    scheduler, request = planning.engine_scheduler(config, kv)
    return scheduler, request, len(kv.kv_cache_groups)


def one_pass(scheduler: Any, request: Any, prompts: list[list[int]], tag: str) -> list[dict]:
    """All prompts to completion, blocks freed; per step: ms of schedule + update."""
    from speculators_hybrid.planning import model_output, prompts_done

    for i, prompt in enumerate(prompts):
        scheduler.add_request(request(f"{tag}-{i}", prompt))
    saved: frozenset[str] = frozenset()
    steps = []
    while scheduler.has_requests() or saved:
        wall, cpu = time.perf_counter(), time.process_time()
        out = scheduler.schedule()
        done = dict.fromkeys(prompts_done(scheduler, out), 1)
        scheduler.update_from_output(out, model_output(out, done, saved))
        steps.append(
            {
                "tokens": out.total_num_scheduled_tokens,
                "files": len(done),  # prompts this step completes: their files follow it
                "wall_ms": 1000 * (time.perf_counter() - wall),
                "cpu_ms": 1000 * (time.process_time() - cpu),
            }
        )
        saved = frozenset(r for r in done if r in scheduler.requests)  # blocks held for a save
        if len(steps) > 10 * len(prompts):
            raise RuntimeError("the scheduler makes no progress")
    return steps


def measure(
    folder: str, plugin: bool, prompts: list[list[int]], passes: int, ids: tuple[int, ...] | None
) -> dict:
    try:
        scheduler, request, groups = build(folder, plugin, ids)
    except Exception as exc:  # noqa: BLE001 (a stock vLLM that refuses is a finding)
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
    one_pass(scheduler, request, prompts, "warm")
    runs = [one_pass(scheduler, request, prompts, f"p{k}") for k in range(passes)]
    busy = [s for run in runs for s in run if s["tokens"]]
    return {
        "kv_cache_groups": groups,
        "steps_per_pass": len(runs[0]),
        "files_per_step": [s["files"] for s in runs[0]],  # the last busy step's are the tail
        "ms_per_step_wall": round(statistics.median(s["wall_ms"] for s in busy), 2),
        "ms_per_step_cpu": round(statistics.median(s["cpu_ms"] for s in busy), 2),
        "ms_per_pass_wall": round(statistics.median(sum(s["wall_ms"] for s in r) for r in runs), 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=2048)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    from speculators_hybrid import cpu

    cpu.prepare()
    from speculators_hybrid.models import write_config
    from speculators_hybrid.versions import installed

    rng = random.Random(0)
    prompts = [
        [rng.randrange(1, 200_000) for _ in range(args.prompt_len)] for _ in range(args.prompts)
    ]
    with tempfile.TemporaryDirectory() as tmp:
        folder = str(write_config(Path(tmp) / PRESET, PRESET, multimodal=True))
        result = {
            "vllm": installed("vllm"),
            "workload": f"{args.prompts} x {args.prompt_len} tokens, 16,384 a step, 20 GiB KV",
            "plain": measure(folder, True, prompts, args.passes, None),
            "plugin": measure(folder, True, prompts, args.passes, IDS),
            "upstream": measure(folder, False, prompts, args.passes, IDS),
        }
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
