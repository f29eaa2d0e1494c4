"""Where the GPU waits, from a torch profiler trace (Chrome JSON, as vLLM's profiler writes it).

The kernel table of `--profile` says what ran, not when the GPU sat idle. This reads the trace
of the profiled pass: GPU busy time is the union of all kernels (and memsets) over every
stream, from the first to the last; each idle gap of at least `min_ms` is named by the CPU
ranges (`record_function` annotations, then ops) open at its middle, innermost first, and by
the kernels that end and start it, and the idle time is summed per innermost annotation. The
host's time in each annotation (vLLM 0.20's step ranges `execute_context_*`, ...) is summed
too, to compare two engines' host work per step. Device-to-host copies are reported apart: ours
run on a stream of their own, beside the compute.

    python benchmarks/trace_gaps.py TRACE.json[.gz] [--min-ms 1]
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

BUSY = ("kernel", "gpu_memset")
COPY = "gpu_memcpy"
CPU = ("user_annotation", "cpu_op")


def load(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


def of_kind(events: list[dict[str, Any]], cats: tuple[str, ...]) -> list[dict[str, Any]]:
    """The complete ("X") events of these categories, by start."""
    return sorted(
        (e for e in events if e.get("ph") == "X" and e.get("cat") in cats), key=lambda e: e["ts"]
    )


def spans(events: list[dict[str, Any]], cats: tuple[str, ...]) -> list[tuple[float, float]]:
    return sorted((e["ts"], e["ts"] + e.get("dur", 0)) for e in of_kind(events, cats))


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in intervals:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def open_at(cpu: list[dict[str, Any]], times: list[float]) -> list[list[dict[str, Any]]]:
    """For each of `times` (ascending), the CPU ranges open then, annotations first, each kind
    innermost (shortest) first. One sweep over `cpu` sorted by start: a trace holds ~10^5-10^6
    CPU events."""
    found, active, i = [], [], 0
    for t in times:
        while i < len(cpu) and cpu[i]["ts"] <= t:
            active.append(cpu[i])
            i += 1
        active = [e for e in active if e["ts"] + e.get("dur", 0) >= t]
        found.append(sorted(active, key=lambda e: (e["cat"] != "user_annotation", e.get("dur", 0))))
    return found


def tally(items: Any, top: int) -> dict[str, dict[str, float]]:
    """Count and seconds per name of (name, seconds) pairs, most seconds first."""
    totals: dict[str, dict[str, float]] = defaultdict(lambda: {"count": 0, "s": 0.0})
    for name, seconds in items:
        totals[name]["count"] += 1
        totals[name]["s"] += seconds
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]["s"])[:top])


def summary(events: list[dict[str, Any]], min_ms: float = 1.0, top: int = 15) -> dict[str, Any]:
    busy = union(spans(events, BUSY))
    if not busy:
        return {"error": "no GPU kernels in the trace"}
    kernels = of_kind(events, BUSY)
    ending = {e["ts"] + e.get("dur", 0): e["name"] for e in kernels}
    starting = {e["ts"]: e["name"] for e in kernels}
    copies = spans(events, (COPY,))
    cpu = of_kind(events, CPU)
    gaps = [
        (a[1], b[0]) for a, b in zip(busy, busy[1:], strict=False) if b[0] - a[1] >= min_ms * 1e3
    ]
    idle_by_label: list[tuple[str, float]] = []
    named: list[dict[str, Any]] = []
    ranges = open_at(cpu, [(start + end) / 2 for start, end in gaps])
    for (start, end), open_then in zip(gaps, ranges, strict=True):
        names = [e["name"] for e in open_then]
        label = names[0] if names else "(no CPU range open)"
        idle_by_label.append((label, (end - start) / 1e6))
        named.append(
            {
                "at_s": (start - busy[0][0]) / 1e6,
                "ms": (end - start) / 1e3,
                "cpu": names[:4],
                "after_kernel": ending.get(start),
                "before_kernel": starting.get(end),
            }
        )
    window = busy[-1][1] - busy[0][0]
    busy_us = sum(end - start for start, end in busy)
    return {
        "window_s": window / 1e6,
        "gpu_busy_s": busy_us / 1e6,
        "gpu_idle_s": (window - busy_us) / 1e6,
        "min_gap_ms": min_ms,
        "gaps": len(gaps),
        "idle_in_gaps_s": sum(end - start for start, end in gaps) / 1e6,
        "by_innermost_cpu_range": tally(idle_by_label, top),
        "largest_gaps": sorted(named, key=lambda g: -g["ms"])[:top],
        "copies_s": sum(end - start for start, end in union(copies)) / 1e6,
        "host_by_annotation": tally(
            ((e["name"], e.get("dur", 0) / 1e6) for e in cpu if e["cat"] == "user_annotation"), top
        ),
    }


def newest_trace(folder: Path) -> Path | None:
    traces = (
        sorted(folder.rglob("*.json*"), key=lambda p: p.stat().st_mtime) if folder.is_dir() else []
    )
    return traces[-1] if traces else None


def of_file(trace: Path, min_ms: float = 1.0, name: str | None = None) -> dict[str, Any]:
    """The summary of one trace, or an `error` entry if it cannot be read (missing, still
    being written, cut short); `trace` in it is `name`, else the file's name."""
    label = name or trace.name
    try:
        return {"trace": label, **summary(load(trace), min_ms)}
    except (OSError, ValueError, KeyError, EOFError, TypeError) as exc:
        return {"trace": label, "error": f"{type(exc).__name__}: {exc}"}


def of_folder(folder: Path, min_ms: float = 1.0) -> dict[str, Any] | None:
    """The summary of the newest trace under `folder` (named by its path inside it); None if
    there is none."""
    trace = newest_trace(folder)
    return None if trace is None else of_file(trace, min_ms, str(trace.relative_to(folder)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", type=Path, help="a trace file, or a folder: its newest trace")
    ap.add_argument("--min-ms", type=float, default=1.0, help="the shortest gap named")
    args = ap.parse_args(argv)
    folder = args.trace if args.trace.is_dir() else None
    result = of_folder(folder, args.min_ms) if folder else of_file(args.trace, args.min_ms)
    if result is None:
        ap.error(f"{args.trace}: no trace in it")
    if "error" in result:
        where = args.trace / result["trace"] if folder else args.trace
        ap.error(f"{where}: {result['error']}")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
