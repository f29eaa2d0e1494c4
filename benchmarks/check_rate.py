"""How fast `speculators-hybrid check` reads real-size hidden-state files, against `cat`.

Writes `--files` files of the real size (Qwen3.6-27B-like extraction: 2,048 tokens x 4 layer ids
x 5,120 hidden, bf16, 84 MB each, random values, with token ids and provenance metadata) into
`--folder`, reads them once with `cat` so they are in the page cache, then times, `--repeats`
times each (median): `cat FILES > /dev/null` (the bytes alone), and check's own file loop
(`check._checked`: every check of `check` on each file, no dataset) with each `--jobs` value.
Prints MB/s and files/s, and writes a JSON with the machine and settings to `--out`.
Needs numpy (`pip install '.[check]'`); no torch, no vLLM.

    PYTHONPATH=$PWD .tox/check/bin/python benchmarks/check_rate.py --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from speculators_hybrid import check  # noqa: E402

TOKENS, IDS, HIDDEN = 2048, 4, 5120  # [2, 32, 61, 64] of the Qwen3.6-27B-like preset


def write_file(path: Path, tokens: int, ids: int, hidden: int, seed: int = 0) -> int:
    """One file as the plugin writes it (safetensors, bf16 hidden states, int64 token ids)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    values = rng.standard_normal((tokens, ids, hidden), dtype=np.float32)
    states = (values.view(np.uint32) >> 16).astype("<u2")  # bf16: float32's top half
    token_ids = np.arange(tokens, dtype="<i8")
    header = {
        "__metadata__": {"vllm_version": "0.20.1", "speculators_hybrid_version": "0.1.0"},
        "hidden_states": {
            "dtype": "BF16",
            "shape": [tokens, ids, hidden],
            "data_offsets": [0, states.nbytes],
        },
        "token_ids": {
            "dtype": "I64",
            "shape": [tokens],
            "data_offsets": [states.nbytes, states.nbytes + token_ids.nbytes],
        },
    }
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(text)) + text)
        out.write(states.tobytes())
        out.write(token_ids.tobytes())
    return path.stat().st_size


def make_files(folder: Path, count: int, tokens: int, ids: int, hidden: int) -> list[str]:
    """`count` files (the first written, the others copies: distinct pages in the cache)."""
    folder.mkdir(parents=True, exist_ok=True)
    first = folder / "hs_0.safetensors"
    write_file(first, tokens, ids, hidden)
    for i in range(1, count):
        shutil.copyfile(first, folder / f"hs_{i}.safetensors")
    return [str(folder / f"hs_{i}.safetensors") for i in range(count)]


def time_cat(paths: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(["cat", *paths], stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def time_check(paths: list[str], jobs: int) -> float:
    start = time.perf_counter()
    reports = list(check._checked(paths, None, jobs))
    took = time.perf_counter() - start
    failed = [r.path for r in reports if not r.ok]
    if failed:
        raise RuntimeError(f"check failed files it should pass: {failed[:3]}")
    return took


def measure(paths: list[str], jobs: list[int], repeats: int) -> dict[str, Any]:
    total = sum(os.path.getsize(p) for p in paths)
    time_cat(paths)  # into the page cache
    check.check_file(paths[0])  # numpy imported, its first calls made
    runs = {"cat": [time_cat(paths) for _ in range(repeats)]}
    for n in jobs:
        runs[f"check --jobs {n}"] = [time_check(paths, n) for _ in range(repeats)]
    rows = {}
    for name, times in runs.items():
        median = statistics.median(times)
        rows[name] = {
            "seconds": median,
            "runs": times,
            "mb_per_s": total / median / 1e6,
            "files_per_s": len(paths) / median,
        }
    return {"files": len(paths), "bytes": total, "results": rows}


def table(doc: dict[str, Any]) -> str:
    lines = [
        f"{doc['files']} files, {doc['bytes'] / 1e6:,.0f} MB, from the page cache "
        f"({doc['settings']['tokens']} tokens x {doc['settings']['ids']} ids x "
        f"{doc['settings']['hidden']} hidden, bf16); median of {doc['settings']['repeats']}",
        f"{'':18} {'MB/s':>8} {'files/s':>8} {'s/file':>8}",
    ]
    for name, row in doc["results"].items():
        lines.append(
            f"{name:18} {row['mb_per_s']:8,.0f} {row['files_per_s']:8.1f} "
            f"{1 / row['files_per_s']:8.4f}"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--files", type=int, default=32, help="files to write and read (default 32)")
    p.add_argument("--folder", type=Path, default=Path("/tmp/spec-hybrid-check-bench"))
    p.add_argument(
        "--jobs",
        type=int,
        nargs="+",
        help="check's --jobs values to time (default: 1 and the cores)",
    )
    p.add_argument("--repeats", type=int, default=3, help="timed runs of each (median)")
    p.add_argument("--tokens", type=int, default=TOKENS)
    p.add_argument("--ids", type=int, default=IDS)
    p.add_argument("--hidden", type=int, default=HIDDEN)
    p.add_argument("--out", type=Path, help="a folder for the JSON and the table")
    p.add_argument("--keep", action="store_true", help="leave the files in --folder")
    args = p.parse_args(argv)
    if min(args.files, args.repeats, args.tokens, args.ids, args.hidden) < 1:
        p.error("--files, --repeats, --tokens, --ids and --hidden are 1 or more")
    args.jobs = sorted(set(args.jobs or [1, check.default_jobs()]))
    if min(args.jobs) < 1:
        p.error("--jobs values are 1 or more")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    paths = make_files(args.folder, args.files, args.tokens, args.ids, args.hidden)
    try:
        doc = measure(paths, args.jobs, args.repeats)
    finally:
        if not args.keep:
            shutil.rmtree(args.folder, ignore_errors=True)
    doc["settings"] = {k: v for k, v in vars(args).items() if k not in ("folder", "out")}
    doc["machine"] = {
        "cpus": os.cpu_count(),
        "cores_usable": check.default_jobs(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    text = table(doc)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y-%m-%d")
        name = f"{stamp}-check-rate-{args.files}x{args.tokens}"
        (args.out / f"{name}.json").write_text(json.dumps(doc, indent=2) + "\n")
        (args.out / f"{name}.txt").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
