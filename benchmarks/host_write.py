"""How fast this host takes hidden-state files: the writer path alone, no GPU, no vLLM.

Our connector's writer threads (vLLM < 0.22) write each file with `save_whole` (aside, then
renamed); vLLM >= 0.22's do the same through safetensors. After a pass's last engine step
the files of that step are written with nothing left to overlap them, so how fast N files
go to disk side by side bounds that tail. For each thread count this writes
`--files-per-thread` files per thread of `--file-mb` each (bf16 [tokens, 4, 5120] by default:
a 2,048-token file at Qwen3.6-27B size is 84 MB), through `save_whole`, through safetensors'
own `save_file` and through one plain `write` of the same bytes, and reports GB/s together and
seconds per file. Meanwhile the main thread, as vLLM's engine thread would, runs a tiny op in a
loop: its longest wait and its waits of 1 ms or more summed say how long the writers held the
GIL. With `--main-thread python` it runs pure Python instead, holding the GIL as vLLM's
scheduler does between steps: then the writers' seconds say what waiting for the GIL costs
them. One unrecorded file first (the pool's and the disk's first use); `--repeat` runs each
setting N times. Files are deleted after each run; "written" means in the page cache, as in
the extraction benchmark.

    python benchmarks/host_write.py --folder /tmp/hw --threads 1 2 4 8 --out result.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HOW = ("save_whole", "save_file", "write")
ROW_BYTES = 4 * 5120 * 2  # one token of 4 ids at hidden 5120, bf16


def one_file(path: str, tensor: Any, how: str) -> float:
    """Write one file; its seconds."""
    import torch

    from speculators_hybrid.vllm_patches.provenance_meta import save_whole

    start = time.perf_counter()
    if how == "save_whole":
        save_whole(path, {"hidden_states": tensor}, None)
    elif how == "save_file":
        from safetensors.torch import save_file

        save_file({"hidden_states": tensor}, path)
    else:
        with open(path, "wb") as f:
            f.write(tensor.view(-1).view(torch.uint8).numpy().data)
    return time.perf_counter() - start


def side_by_side(
    folder: Path, threads: int, files: int, tensors: list[Any], how: str, main: str = "op"
) -> dict:
    """`files` files from `threads` threads at once; seconds, GB/s and seconds per file."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = [str(folder / f"f{i}.safetensors") for i in range(files)]
    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        futures = [
            pool.submit(one_file, path, tensors[i % len(tensors)], how)
            for i, path in enumerate(paths)
        ]
        waits = main_thread_waits(lambda: all(f.done() for f in futures), main)
        each = [f.result() for f in futures]
    seconds = time.perf_counter() - start
    written = sum(os.path.getsize(p) for p in paths)
    shutil.rmtree(folder)
    return {
        "how": how,
        "main_thread": main,
        "threads": threads,
        "files": files,
        "seconds": seconds,
        "gb_per_s": written / seconds / 1e9,
        "mean_file_s": statistics.mean(each),
        "max_file_s": max(each),
        **waits,
    }


def main_thread_waits(finished: Any, main: str = "op") -> dict[str, float]:
    """Run a tiny op ("op": a torch op, which lets the GIL go; "python": pure Python, which
    holds it, as vLLM's scheduler does between steps) in a loop until `finished()`; the longest
    gap between two of them and the gaps of 1 ms or more summed, in ms."""
    import torch

    gaps, last = [], time.perf_counter()
    while not finished():
        if main == "op":
            torch.ones(8).add_(1)
        else:
            sum(range(200))
        now = time.perf_counter()
        gaps.append(now - last)
        last = now
    return {
        "main_thread_max_wait_ms": max(gaps, default=0.0) * 1e3,
        "main_thread_waits_over_1ms_ms": sum(g for g in gaps if g >= 1e-3) * 1e3,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    import safetensors
    import torch

    rows = max(1, int(args.file_mb * 1e6) // ROW_BYTES)
    count = max(args.threads) * args.files_per_thread
    # Distinct tensors with their pages touched, as the writer's pinned host copies are.
    tensors = [torch.full((rows, 4, 5120), i + 1.0, dtype=torch.bfloat16) for i in range(count)]
    runs = []
    side_by_side(args.folder / "run", 1, 1, tensors, args.how[0])  # warm-up: the pool, the disk
    for main in args.main_thread:
        for how in args.how:
            for threads in args.threads:
                files = threads * args.files_per_thread
                for _ in range(args.repeat):
                    run = side_by_side(args.folder / "run", threads, files, tensors, how, main)
                    runs.append(run)
                    print(json.dumps(run), flush=True)
    return {
        "date": time.strftime("%Y-%m-%d"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "safetensors": safetensors.__version__,
        "folder": str(args.folder),
        "file_bytes": rows * ROW_BYTES,
        "runs": runs,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--folder", type=Path, default=Path("/tmp/spec-hybrid-host-write"))
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--files-per-thread", type=int, default=2)
    ap.add_argument("--file-mb", type=float, default=84.0)
    ap.add_argument("--how", nargs="+", choices=HOW, default=list(HOW))
    ap.add_argument("--repeat", type=int, default=1, help="runs of each setting")
    ap.add_argument("--main-thread", nargs="+", choices=("op", "python"), default=["op"])
    ap.add_argument("--out", type=Path, help="the JSON result (printed otherwise)")
    args = ap.parse_args(argv)
    if min(args.threads) < 1 or min(args.files_per_thread, args.repeat) < 1 or args.file_mb <= 0:
        ap.error("--threads, --files-per-thread and --repeat must be >= 1, --file-mb > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(ROOT))
    args = parse_args(argv)
    result = run(args)
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
