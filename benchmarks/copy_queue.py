"""Does a small device-to-host copy wait behind the files' big ones? (GPU only, no vLLM)

vLLM's step needs a few bytes from the GPU each step (sampled tokens, counts), copied on a
stream of its own and waited for by the host. The writer's copies of one 16,384-token step at
the real size are 8 x 84 MB, on another stream. Should both share one copy engine in order, the
host's small copy waits for up to ~670 MB of copies, and the GPU idles while the host is late.
Here: the latency of a small copy (issue to event done) alone, beside the big copies in one
piece each, beside the same copies cut into chunks queued at once, and beside the plugin's
paced copies (vllm_patches/host_copy.py: pieces from a thread, two queued at a time); and the
big copies' GB/s.

    python3 benchmarks/copy_queue.py --out /tmp/out/copy_queue.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from speculators_hybrid.vllm_patches import host_copy

FILE_SHAPE = (2048, 4, 5120)  # one 2,048-token file at the real size: 84 MB of bf16
FILES = 8  # one step of 16,384 tokens


def pieces(dst: torch.Tensor, src: torch.Tensor, chunk_bytes: int) -> list[tuple[Any, Any]]:
    """(dst, src) pairs covering the tensor in pieces of at most `chunk_bytes` (whole if 0)."""
    if not chunk_bytes:
        return [(dst, src)]
    flat_dst, flat_src = dst.view(-1), src.view(-1)
    step = max(1, chunk_bytes // src.element_size())
    return [(flat_dst[i : i + step], flat_src[i : i + step]) for i in range(0, src.numel(), step)]


def big_copies(stream, sources, targets, chunk_bytes: int) -> None:
    with torch.cuda.stream(stream):
        for src, dst in zip(sources, targets, strict=True):
            for dst_piece, src_piece in pieces(dst, src, chunk_bytes):
                dst_piece.copy_(src_piece, non_blocking=True)


def small_copy_ms(stream, small_src, small_dst) -> float:
    start = time.perf_counter()
    with torch.cuda.stream(stream):
        small_dst.copy_(small_src, non_blocking=True)
        done = torch.cuda.Event()
        done.record(stream)
    done.synchronize()
    return (time.perf_counter() - start) * 1e3


def paced_copies(copier, sources) -> list:
    return [copier.submit({"hidden_states": src}) for src in sources]


def case(chunk_bytes: int | None, probes: int = 40, paced: bool = False) -> dict:
    copy_stream, probe_stream = torch.cuda.Stream(), torch.cuda.Stream()
    sources = [torch.randn(FILE_SHAPE, device="cuda").to(torch.bfloat16) for _ in range(FILES)]
    targets = [torch.empty(FILE_SHAPE, dtype=torch.bfloat16, pin_memory=True) for _ in range(FILES)]
    small_src = torch.arange(64, device="cuda", dtype=torch.int32)
    small_dst = torch.empty(64, dtype=torch.int32, pin_memory=True)
    torch.cuda.synchronize()
    start = time.perf_counter()
    futures = []
    if paced:
        device = torch.device("cuda", torch.cuda.current_device())
        futures = paced_copies(host_copy.PacedCopier(device, chunk_bytes or 0), sources)
    elif chunk_bytes is not None:
        big_copies(copy_stream, sources, targets, chunk_bytes)
    latencies = []
    for _ in range(probes):
        latencies.append(small_copy_ms(probe_stream, small_src, small_dst))
        time.sleep(0.0005)
    copy_stream.synchronize()
    for future in futures:
        future.result()[1].synchronize()
    total_s = time.perf_counter() - start
    nbytes = sum(t.numel() * t.element_size() for t in sources)
    return {
        "chunk_bytes": chunk_bytes,
        "paced": paced,
        "probe_ms_median": statistics.median(latencies),
        "probe_ms_max": max(latencies),
        "probe_ms_first": latencies[0],
        "big_copies_gb_per_s": nbytes / total_s / 1e9 if chunk_bytes is not None else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    case(0, probes=5)  # warm-up: streams, pinned pool, kernels
    cases = {"alone": None, "one piece": 0, "4 MiB chunks": 4 << 20, "16 MiB chunks": 16 << 20}
    results = {name: case(chunk) for name, chunk in cases.items()}
    case(host_copy.SUGGESTED_MIB << 20, probes=5, paced=True)  # warm-up: a copier's thread
    for mib in (2, 8, 32):
        results[f"paced, {mib} MiB pieces"] = case(mib << 20, paced=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), **results}, indent=1))
    for name, result in results.items():
        print(name, json.dumps(result))


if __name__ == "__main__":
    main()
