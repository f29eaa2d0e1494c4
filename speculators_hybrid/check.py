"""`speculators-hybrid check PATH... [--dataset ARROW_DIR] [--json]`: validate hidden-state files.

The contract (vLLM's hidden-states connectors, speculators' readers): a safetensors file with
`hidden_states` [tokens, layer ids, hidden] in a float dtype and `token_ids` int64 [tokens].
Files of both hs-connectors backends are read: `file` (values in the model's dtype) and `fp8`
(float8 e4m3 values with `hidden_states_scales`, one per token; the report says which backend
wrote each file). Each file is checked for: both keys, their dtypes and ranks, `shape[0] ==
len(token_ids)`, for fp8 the scales (present, [tokens, 1, 1], finite, positive, within
bfloat16's range times the largest float8 value: then a value the trainer's reader scales back
is zero, NaN or Inf exactly where its float8 byte is, so the scan reads the bytes),
the same layer count and width as the other files, finite values, no all-zero token row,
layer slot or (token, slot) vector (vLLM 0.24.x wrote zeros silently: speculators issue 613),
and provenance metadata naming a known-bad writer. With `--dataset` (speculators' prepared
data, `input_ids` + `loss_mask`), `hs_<i>.safetensors` is matched to sample `i`, the way
speculators' `ArrowDataset` and `FileTransfer.get_cached` find it, and `token_ids` must equal
that sample's `input_ids`. A `<file>.rejected` marker (the opt-in guard's, or a write that
failed) is a failed file with the marker's reason. Files are read `--jobs` at a time (default:
the cores), each in row chunks of its values' bits (memory-mapped with numpy,
safetensors_file.py: no torch import), so folders of hundreds of thousands of files run in
bounded memory, near `cat`'s rate (benchmarks/check_rate.py and its results). Exit status: 0 all
good, 1 some file failed (each is named with its reasons), 2 nothing to check or bad arguments
(a path that does not exist).
These checks cannot see a plausible but wrong file (a layer off by one, another request's rows, a
bad prefix-cache hit): `--verify-with MODEL_DIR` then runs `speculators-hybrid verify`, which
recomputes a sample with the model.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import IO, Any

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from speculators_hybrid.hidden_files import (
    BACKEND_KEY,
    HS_NAME,
    PATCHES_KEY,
    REJECTED,
    SCALES,
    backend,
    find_files,
    format_problems,
    patch_ids,
)
from speculators_hybrid.usage import refuse

CHUNK_BYTES = 4 << 20  # rows scanned at a time: small enough to stay in the CPU's cache
FLOAT_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1}
EXAMPLES = 5  # token indices quoted per problem
INSTALL_CHECK = "pip install './speculators-hybrid[check]' (the clone's folder; numpy, datasets)"
BF16_MAX = 3.3895313892515355e38  # the trainer's reader scales fp8 values back in bfloat16


@dataclass(frozen=True)
class KnownBad:
    vllm: str  # PEP 440 specifier of the writer's vLLM version
    fixes: frozenset[str]  # speculators-hybrid patch ids that make such files good
    why: str


# Writers whose hybrid hidden states are known to be wrong. `fixes`: the id of our patch for
# the 0.24.x read-side block size (vllm_patches/hidden_read.py; tests/unit/test_check.py holds
# that it is a patch for exactly those releases).
KNOWN_BAD = (
    KnownBad(
        vllm=">=0.24.0,<0.25.0",
        fixes=frozenset({"hidden-states-read-slots"}),
        why=(
            "written by vLLM {version} without a speculators-hybrid fix for its hybrid read "
            "slots (all-zero or misplaced hidden states: speculators issue 613, fixed in vLLM "
            "0.25.0 by PR 46301)"
        ),
    ),
)


@dataclass
class FileReport:
    path: str
    errors: list[dict[str, str]] = field(default_factory=list)
    warnings: list[dict[str, str]] = field(default_factory=list)
    tokens: int | None = None
    n_ids: int | None = None
    hidden: int | None = None
    dtype: str | None = None
    backend: str | None = None  # "file" or "fp8": the hs-connectors backend whose format it is
    sample: int | None = None
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.errors

    def error(self, code: str, message: str) -> None:
        self.errors.append({"code": code, "message": message})

    def warn(self, code: str, message: str) -> None:
        self.warnings.append({"code": code, "message": message})

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, **asdict(self)}


class Samples:
    """speculators' prepared dataset (`datasets.save_to_disk`), read one row at a time."""

    def __init__(self, path: str) -> None:
        from datasets import Dataset, load_from_disk

        data = load_from_disk(path)
        if not isinstance(data, Dataset):
            raise ValueError(f"{path} holds a {type(data).__name__}, not one Dataset")
        missing = {"input_ids", "loss_mask"} - set(data.column_names)
        if missing:
            raise ValueError(f"{path} has no column {', '.join(sorted(missing))}")
        self.path = path
        self._ids = data.select_columns(["input_ids"]).with_format(None)
        self.matched: set[int] = set()
        self._lock = threading.Lock()  # files are checked on several threads (--jobs)

    def __len__(self) -> int:
        return len(self._ids)

    def input_ids(self, index: int) -> list[int]:
        with self._lock:
            return list(self._ids[index]["input_ids"])


def provenance_problem(metadata: dict[str, str]) -> str | None:
    """Why the writer named in `metadata` is known to produce bad files, or None."""
    version = metadata.get("vllm_version")
    if not version:
        return None
    try:
        release = Version(Version(version).base_version)
    except InvalidVersion:
        return None
    patches = patch_ids(metadata.get(PATCHES_KEY, ""))
    for bad in KNOWN_BAD:
        if release in SpecifierSet(bad.vllm) and not patches & bad.fixes:
            return bad.why.format(version=version)
    return None


def _indices(mask: Any, offset: int) -> list[int]:
    import numpy as np

    return [offset + int(i) for i in np.flatnonzero(mask)[:EXAMPLES]]


# IEEE formats read by their bits: (unsigned type, all but the sign bit, +Inf). Magnitude bits
# above +Inf's are NaN, equal are Inf, zero is +-0; float8 goes through its value table.
BITS = {
    "BF16": ("<u2", 0x7FFF, 0x7F80),
    "F16": ("<u2", 0x7FFF, 0x7C00),
    "F32": ("<u4", 0x7FFF_FFFF, 0x7F80_0000),
    "F64": ("<u8", 0x7FFF_FFFF_FFFF_FFFF, 0x7FF0_0000_0000_0000),
}


def _magnitudes(tensor: Any, dtype: str, start: int, stop: int, out: Any) -> tuple[Any, int]:
    """Rows [start, stop) as the bits of their magnitudes (sign cleared, into `out`: no other
    copy of the file's data), and +Inf's bits; float8 as float32 magnitudes, +Inf."""
    import numpy as np

    if dtype not in BITS:
        return np.abs(tensor[start:stop]), np.float32(np.inf)
    kind, magnitude, infinity = BITS[dtype]
    raw = tensor.raw(slice(start, stop)).view(kind)
    return np.bitwise_and(raw, magnitude, out=out[: len(raw)]), infinity


def _scan_values(tensor: Any, shape: list[int], dtype: str, report: FileReport, chunk: int) -> None:
    """Finite values, and no all-zero token row, layer slot or vector, one row chunk at a time,
    on the values' bits (numpy: check never imports torch): a pass to clear the sign bits and a
    max per (token, slot) vector; NaN and Inf counted only in a chunk that has them."""
    import numpy as np

    tokens, n_ids, hidden = shape
    rows = max(1, chunk // max(1, n_ids * hidden * FLOAT_BYTES[dtype]))
    nan = inf = zero_rows = zero_vectors = 0
    first_rows: list[int] = []
    first_bad: list[int] = []
    slot_used = np.zeros(n_ids, dtype=bool)
    out = np.empty((min(rows, tokens), n_ids, hidden), BITS[dtype][0] if dtype in BITS else "u1")
    for start in range(0, tokens, rows):
        part, infinity = _magnitudes(tensor, dtype, start, min(start + rows, tokens), out)
        top = part.max(axis=2)  # [rows, slots]: the largest magnitude; NaN's bits are above Inf's
        if bool((top >= infinity).any()) or np.isnan(top).any():
            nans = (part > infinity) | np.isnan(part)
            infs = part == infinity
            nan += int(nans.sum())
            inf += int(infs.sum())
            if len(first_bad) < EXAMPLES:
                first_bad += _indices((nans | infs).any(axis=(1, 2)), start)
        used = top != 0  # NaN counts as used
        empty_rows = ~used.any(axis=1)
        zero_rows += int(empty_rows.sum())
        zero_vectors += int((~used[~empty_rows]).sum())
        if len(first_rows) < EXAMPLES:
            first_rows += _indices(empty_rows, start)
        slot_used |= used.any(axis=0)
    if nan or inf:
        report.error(
            "non_finite", f"{nan} NaN and {inf} Inf values (first at tokens {first_bad[:EXAMPLES]})"
        )
    if zero_rows == tokens:
        report.error("zero_rows", "every hidden state is zero")
        return
    if zero_rows:
        report.error(
            "zero_rows",
            f"{zero_rows} of {tokens} token rows are all zero (first at tokens "
            f"{first_rows[:EXAMPLES]})",
        )
    empty_slots = [i for i, used in enumerate(slot_used.tolist()) if not used]
    # fp8: one scale per token over every slot, so a slot far below the token's largest value
    # rounds to zero
    why = " (fp8 rounds a slot to zero where it is tiny beside the token's largest value)"
    why = why if report.backend == "fp8" else ""
    if empty_slots:
        report.error("zero_layers", f"layer slots {empty_slots} are zero for every token{why}")
    elif zero_vectors:
        report.error(
            "zero_vectors", f"{zero_vectors} (token, layer slot) vectors are all zero{why}"
        )


def _format_ok(handle: Any, keys: set[str], states: Any, report: FileReport) -> bool:
    """Which backend's format the file is in; for fp8, its scales as the trainer applies them.
    False where the values cannot be read as the trainer would."""
    import numpy as np

    dtype = states.get_dtype()
    report.backend = backend(keys, dtype)
    scales = handle.get_slice(SCALES) if SCALES in keys else None
    layout = (scales.get_dtype(), scales.get_shape()) if scales is not None else None
    declared = report.metadata.get(BACKEND_KEY)
    problems = format_problems(keys, (dtype, states.get_shape()), layout, declared)
    for problem in problems:
        report.error("bad_format", problem)
    if problems or scales is None:
        return not problems
    values = scales.all().reshape(-1).astype(np.float64)
    bad = ~np.isfinite(values) | (values <= 0)
    if bad.any():
        report.error(
            "bad_scales",
            f"{int(bad.sum())} scales are not finite and positive (first at tokens "
            f"{_indices(bad, 0)})",
        )
        return False
    from speculators_hybrid.safetensors_file import FLOAT8  # every value of each float8 byte

    table = FLOAT8[dtype]
    largest = float(np.abs(table[np.isfinite(table)]).max())  # 448 for E4M3, 57344 for E5M2
    over = values * largest > BF16_MAX
    if over.any():
        report.error(
            "bad_scales",
            f"{int(over.sum())} scales overflow bfloat16 when applied (first at tokens "
            f"{_indices(over, 0)})",
        )
        return False
    return True


def _match_sample(handle: Any, report: FileReport, samples: Samples) -> None:
    name = HS_NAME.match(os.path.basename(report.path))
    if name is None:
        report.warn("unlinked", "not named hs_<index>.safetensors: not matched to a sample")
        return
    index = report.sample = int(name.group(1))
    if index >= len(samples):
        report.error("no_sample", f"sample {index} is not in the dataset ({len(samples)} rows)")
        return
    samples.matched.add(index)
    expected = samples.input_ids(index)
    got = handle.get_tensor("token_ids").tolist()
    if got != expected:
        pairs = enumerate(zip(got, expected, strict=False))
        at = next((i for i, (a, b) in pairs if a != b), None)
        where = f"first difference at token {at}" if at is not None else "one is a prefix"
        report.error(
            "token_mismatch",
            f"token_ids differ from sample {index}'s input_ids ({len(got)} vs "
            f"{len(expected)} tokens, {where})",
        )


def _inspect(handle: Any, report: FileReport, samples: Samples | None, chunk: int) -> None:
    report.metadata = dict(handle.metadata() or {})
    bad_writer = provenance_problem(report.metadata)
    if bad_writer:
        report.error("bad_provenance", bad_writer)
    elif "vllm_version" not in report.metadata:
        report.warn(
            "no_provenance",
            "no provenance metadata, so the writer is unknown (vLLM without speculators-hybrid "
            "writes none; vLLM 0.24.x can write zeros or other requests' rows for hybrid "
            "targets, and only zero rows show in the checks)",
        )
    keys = set(handle.keys())
    for key in sorted({"hidden_states", "token_ids"} - keys):
        report.error("missing_key", f"no {key!r} tensor (has {sorted(keys)})")
    tokens = None
    if "token_ids" in keys:
        ids = handle.get_slice("token_ids")
        dtype, shape = ids.get_dtype(), ids.get_shape()
        if dtype != "I64":
            report.error("bad_dtype", f"token_ids is {dtype}, expected I64 (int64)")
        if len(shape) != 1:
            report.error("bad_shape", f"token_ids has shape {shape}, expected [tokens]")
        else:
            tokens = shape[0]
            if dtype == "I64" and tokens:
                negative = _indices(ids.all() < 0, 0)
                if negative:
                    report.error(
                        "bad_token_id",
                        f"token_ids holds negative ids (at tokens {negative[:EXAMPLES]})",
                    )
    if "hidden_states" in keys:
        states = handle.get_slice("hidden_states")
        dtype, shape = states.get_dtype(), states.get_shape()
        report.dtype = dtype
        if dtype not in FLOAT_BYTES:
            report.error("bad_dtype", f"hidden_states is {dtype}, expected a float dtype")
        if len(shape) != 3:
            report.error(
                "bad_shape", f"hidden_states has shape {shape}, expected [tokens, ids, hidden]"
            )
            return
        report.tokens, report.n_ids, report.hidden = shape
        readable = _format_ok(handle, keys, states, report)
        if tokens is not None and shape[0] != tokens:
            report.error(
                "length_mismatch", f"hidden_states has {shape[0]} tokens, token_ids {tokens}"
            )
        if 0 in shape:
            report.error("empty", f"hidden_states has shape {shape}")
        elif dtype in FLOAT_BYTES and readable:
            _scan_values(states, shape, dtype, report, chunk)
    if samples is not None and tokens is not None:
        _match_sample(handle, report, samples)


def check_file(path: str, samples: Samples | None = None, chunk: int = CHUNK_BYTES) -> FileReport:
    """Every check on one file; problems are reported, never raised. A `<path>.rejected`
    marker (the guard's, or a write that failed) is reported as `path` failed, with its reason."""
    from speculators_hybrid.safetensors_file import NotSafetensors, SafetensorsFile

    if path.endswith(REJECTED):
        report = FileReport(path[: -len(REJECTED)])
        try:
            with open(path, errors="replace") as marker:
                reason = " ".join(marker.read().split()) or "no reason given"
        except OSError as exc:
            reason = f"(the marker cannot be read: {exc.strerror or exc})"
        report.error("rejected", f"not written, {path} says: {reason}")
        return report
    report = FileReport(path)
    try:
        with SafetensorsFile(path) as handle:
            _inspect(handle, report, samples, chunk)
    except NotSafetensors as exc:
        report.error("unreadable", str(exc))
    except OSError as exc:
        report.error("unreadable", f"cannot read it: {exc.strerror or exc}")
    except Exception as exc:  # noqa: BLE001 (anything else: say what, keep going)
        report.error("unreadable", f"{type(exc).__name__}: {exc}")
    return report


def mark_inconsistent(reports: list[FileReport]) -> None:
    """Flag files whose layer count or width differs from the most common one."""
    shapes = Counter((r.n_ids, r.hidden) for r in reports if r.n_ids is not None)
    if len(shapes) < 2:
        return
    (n_ids, hidden), count = shapes.most_common(1)[0]
    for report in reports:
        if report.n_ids is not None and (report.n_ids, report.hidden) != (n_ids, hidden):
            report.error(
                "inconsistent_shape",
                f"{report.n_ids} layer ids x {report.hidden} hidden; {count} of "
                f"{sum(shapes.values())} files have {n_ids} x {hidden}",
            )


def mark_mixed_dtypes(reports: list[FileReport]) -> None:
    """Flag files whose hidden-state dtype differs from the most common one (one server writes
    one dtype: a mix is files of two runs, or of two models)."""
    dtypes = Counter(r.dtype for r in reports if r.dtype)
    if len(dtypes) < 2:
        return
    common, count = dtypes.most_common(1)[0]
    for report in reports:
        if report.dtype and report.dtype != common:
            report.error(
                "inconsistent_dtype",
                f"hidden_states is {report.dtype}; {count} of {sum(dtypes.values())} files "
                f"are {common}",
            )


def progress(total: int) -> Any:
    """tqdm's bar on a terminal's stderr (nothing otherwise, or without tqdm)."""
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="file", file=sys.stderr, disable=not sys.stderr.isatty())


def summarize(reports: list[FileReport], samples: Samples | None) -> dict[str, Any]:
    failed = [r for r in reports if not r.ok]
    summary: dict[str, Any] = {
        "files": len(reports),
        "ok": len(reports) - len(failed),
        "failed": len(failed),
        "tokens": sum(r.tokens or 0 for r in reports),
        "shapes": dict(Counter(f"{r.n_ids}x{r.hidden}" for r in reports if r.n_ids is not None)),
        "dtypes": dict(Counter(r.dtype for r in reports if r.dtype)),
        "backends": dict(Counter(r.backend for r in reports if r.backend)),
        "writers": dict(Counter(r.metadata.get("vllm_version", "unknown") for r in reports)),
        "problems": dict(Counter(e["code"] for r in reports for e in r.errors)),
        "warnings": dict(Counter(w["code"] for r in reports for w in r.warnings)),
        "dataset": None,
    }
    if samples is not None:
        summary["dataset"] = {
            "path": samples.path,
            "samples": len(samples),
            "samples_with_a_file": len(samples.matched),
        }
    return summary


def _counts(counter: dict[str, int]) -> str:
    return ", ".join(f"{key} ({n})" for key, n in sorted(counter.items())) or "-"


def print_text(summary: dict[str, Any], reports: list[FileReport], out: IO[str]) -> None:
    rows = [
        ("files", str(summary["files"])),
        ("ok", str(summary["ok"])),
        ("failed", str(summary["failed"])),
        ("tokens", f"{summary['tokens']:,}"),
        ("layer ids x hidden", _counts(summary["shapes"])),
        ("dtype", _counts(summary["dtypes"])),
        ("backend", _counts(summary["backends"])),
        ("written by vLLM", _counts(summary["writers"])),
        ("problems", _counts(summary["problems"])),
    ]
    if summary["warnings"]:
        rows.append(("warnings", _counts(summary["warnings"])))
    if summary["dataset"]:
        data = summary["dataset"]
        rows.append(
            ("dataset", f"{data['samples_with_a_file']} of {data['samples']} samples have a file")
        )
    for label, value in rows:
        print(f"  {label:<20} {value}", file=out)
    print_failures(reports, out)


def print_failures(reports: list[FileReport], out: IO[str]) -> None:
    for report in reports:
        if report.errors:
            reasons = "; ".join(e["message"] for e in report.errors)
            print(f"FAILED {report.path}: {reasons}", file=out)


def usage_error(message: str) -> int:
    return refuse("check", message)


def _lock_files(paths: list[str]) -> int:
    """How many `<file>.lock` files (a writer's, while it writes) lie under the folders."""
    return sum(
        name.endswith(".lock")
        for path in paths
        if os.path.isdir(path)
        for _, _, files in os.walk(path)
        for name in files
    )


def default_jobs() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _checked(paths: list[str], samples: Samples | None, jobs: int) -> Iterator[FileReport]:
    """check_file on each path, in order, `jobs` files at a time: threads, since numpy's scans
    run without the GIL (a few files ahead at most: bounded memory)."""
    if jobs == 1 or len(paths) == 1:
        yield from (check_file(path, samples) for path in paths)
        return
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        pending: deque[Any] = deque()
        for path in paths:
            pending.append(pool.submit(check_file, path, samples))
            if len(pending) >= 2 * jobs:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def _check(args: argparse.Namespace) -> int:
    if args.jobs is not None and args.jobs < 1:
        return usage_error(f"--jobs {args.jobs}: give 1 or more files at a time")
    args.jobs = args.jobs or default_jobs()
    missing = [p for p in args.paths if not os.path.exists(p) and not os.path.exists(p + REJECTED)]
    if missing:
        return usage_error(f"no such file or folder: {', '.join(missing)}")
    for flag, folder in (("--verify-with", args.verify_with), ("--dataset", args.dataset)):
        if folder and os.path.isfile(folder):
            parent = os.path.dirname(os.path.abspath(folder))
            return usage_error(f"{flag} {folder} is a file: give its folder ({parent})")
    if args.verify_with and not os.path.isfile(os.path.join(args.verify_with, "config.json")):
        return usage_error(
            f"--verify-with {args.verify_with}: no config.json there; give the model's folder "
            "(weights + config)"
        )
    try:
        import numpy  # noqa: F401
    except ImportError:
        return usage_error(
            f"check reads files with numpy, which is not installed here: {INSTALL_CHECK}"
        )
    samples = None
    if args.dataset:
        if not os.path.isdir(args.dataset):
            return usage_error(f"--dataset {args.dataset}: no such folder")
        try:
            import datasets  # noqa: F401
        except ImportError:
            return usage_error(f"--dataset needs the `datasets` package: {INSTALL_CHECK}")
        try:
            samples = Samples(args.dataset)
        except Exception as exc:  # noqa: BLE001
            return usage_error(f"cannot read dataset {args.dataset}: {exc}")
    paths = list(find_files(args.paths, rejected=True))
    if not paths:
        locks = _lock_files(args.paths)
        if locks:
            return usage_error(
                f"no .safetensors files found, only {locks} .lock files: the writer has not "
                "finished those files (or stopped before it did); wait for it, or see the "
                "server's log"
            )
        where = ", ".join(args.paths)
        return usage_error(f"no .safetensors files in {where}: give the server's output folder")
    bar = progress(len(paths))
    reports: list[FileReport] = []
    failed = 0
    for report in _checked(paths, samples, args.jobs):
        failed += not report.ok
        reports.append(report)
        if bar is not None:
            bar.set_postfix(failed=failed, refresh=False)
            bar.update()
    if bar is not None:
        bar.close()
    mark_inconsistent(reports)
    mark_mixed_dtypes(reports)
    summary = summarize(reports, samples)
    passed = [r.path for r in reports if r.ok]
    if args.json:
        verified, document = _verify_with(args.verify_with, passed, as_json=True)
        result = {"summary": summary, "files": [r.to_json() for r in reports]}
        json.dump({**result, "verify": document} if args.verify_with else result, sys.stdout)
        print()
        print_failures(reports, sys.stderr)  # the names, for humans and CI logs
    else:
        print_text(summary, reports, sys.stdout)
        verified, _ = _verify_with(args.verify_with, passed, as_json=False)
    return max(1 if summary["failed"] else 0, verified)


def _verify_with(model: str | None, paths: list[str], as_json: bool) -> tuple[int, Any]:
    """`--verify-with MODEL_DIR`: `verify`'s default sample of the files that passed."""
    if not model:
        return 0, None
    if not paths:
        print(
            "speculators-hybrid check: no file passed the static checks; nothing to verify",
            file=sys.stderr,
        )
        return 0, None
    from speculators_hybrid.verify.command import verify_paths

    if not as_json:
        print()
    return verify_paths(paths, model, as_json=as_json)


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "check",
        help="validate hidden-state files before training on them",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("paths", nargs="+", metavar="PATH", help="files or folders of them")
    parser.add_argument("--dataset", metavar="ARROW_DIR", help="speculators' prepared dataset")
    parser.add_argument("--json", action="store_true", help="summary and per-file report as JSON")
    parser.add_argument(
        "--jobs",
        type=int,
        metavar="N",
        help="files checked at a time (default: the cores this process may use)",
    )
    parser.add_argument(
        "--verify-with",
        metavar="MODEL_DIR",
        help="then `speculators-hybrid verify` a sample of the files that passed against this "
        'model (its default: 32 files, seed 0); JSON: under the key "verify"',
    )
    parser.set_defaults(func=_check)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="speculators-hybrid")
    add_cli(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["check", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
