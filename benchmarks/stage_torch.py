"""Stage another torch for the GPU machine, for vLLM releases that do not pin the image's torch.

The device image has torch 2.11.0 (CUDA 13.0 wheels) and no network; vLLM 0.27.0-0.32.0 pin
torch 2.13.0 and 0.33.0-0.34.0 pin 2.14.0. This script, run here from the repository root:

1. reads the torch pin of the vLLM release from PyPI's metadata (or takes `--torch`);
2. resolves that torch's dependencies and torch 2.11.0's for CPython 3.12 on Linux x86_64 from
   PyPI (metadata only, through `pip install --dry-run --report`);
3. keeps torch, plus each `triton`, `nvidia-*` and `cuda-*` package whose 2.11.0 version does
   not satisfy the new torch's requirements (the others are the image's and stay there);
4. downloads those wheels (PyPI only) and writes them as one tar stream cut into parts of at
   most `--part-bytes` (60 MB: a call carries 64 MiB) with their SHA-256 sums:

   .device/torch-parts/t001 ..  one part per device call
   .device/torch/               parts.sha256, wheels.sha256, needs.txt, TORCH_VERSION, CALLS.txt
   .device/bin/torch-site.sh    the device side (join, check, install, run; see its header)

`--wheels DIR` skips steps 1-4's network and packs the wheels found in DIR.

    python benchmarks/stage_torch.py 0.34.0
    python benchmarks/stage_torch.py --torch 2.13.0 --cache ~/.cache/stage-torch
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEVICE_SCRIPT = ROOT / "benchmarks" / "torch_site.sh"
BASE_TORCH = "2.11.0"  # the device image's
INDEX = "https://pypi.org/simple"
PLATFORMS = [f"manylinux_2_{i}_x86_64" for i in range(35, 16, -1)] + [
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
]
# pip's options for wheels the device's Python installs (binary only, CPython 3.12, its tags)
DEVICE_WHEELS = [
    *("--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp"),
    *(arg for tag in PLATFORMS for arg in ("--platform", tag)),
]
# Markers as the device's Python sees them.
DEVICE_ENV = {
    "python_version": "3.12",
    "python_full_version": "3.12.0",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
}
SHIPPED_FAMILIES = ("torch", "triton", "nvidia-", "cuda-")
STAGE_DIR = "/tmp/torch-stage"  # on the device; outside /tmp/stash, which a vLLM restage clears


def fail(message: str) -> None:
    print(f"stage_torch: {message}", file=sys.stderr)
    raise SystemExit(2)


def norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def pip(*args: str) -> list[str]:
    # --isolated: PyPI only, whatever local indexes or constraints the user's pip config adds
    return [sys.executable, "-m", "pip", "--isolated", "--disable-pip-version-check", *args]


def report(requirement: str, cache: Path, deps: bool = True) -> list[dict[str, Any]]:
    """pip's resolution of `requirement` for the device (metadata only), cached as JSON."""
    out = cache / f"report-{requirement.replace('=', '')}{'' if deps else '-nodeps'}.json"
    if not out.exists():
        cmd = pip("install", "-q", "--dry-run", "--ignore-installed", *DEVICE_WHEELS)
        cmd += ["--target", str(cache / "none"), "--index-url", INDEX, "--report", str(out)]
        cmd += ([] if deps else ["--no-deps"]) + [requirement]
        if subprocess.run(cmd).returncode != 0:
            fail(f"pip could not resolve {requirement} from PyPI (see above)")
    items: list[dict[str, Any]] = json.loads(out.read_text())["install"]
    return items


def vllm_torch(version: str, cache: Path) -> str:
    """The torch version that vLLM `version` pins."""
    from packaging.requirements import Requirement

    for item in report(f"vllm=={version}", cache, deps=False):
        for line in item["metadata"].get("requires_dist", []):
            req = Requirement(line)
            if norm(req.name) == "torch":
                pins = [s.version for s in req.specifier if s.operator == "=="]
                if pins:
                    return pins[0]
    fail(f"vllm {version} pins no torch version; pass --torch")
    return ""


def requirements(closure: list[dict[str, Any]]) -> dict[str, Any]:
    """Per package name, the intersection of what the closure requires of it (on the device)."""
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    by_name = {
        norm(it["metadata"]["name"]): it["metadata"].get("requires_dist", []) for it in closure
    }
    extras: dict[str, set[str]] = {name: set() for name in by_name}
    applied: list[Requirement] = []
    changed = True
    while changed:  # extras switch requirements on, which may ask for more extras
        changed, applied = False, []
        for name, lines in by_name.items():
            for line in lines:
                req = Requirement(line)
                envs = [{**DEVICE_ENV, "extra": e} for e in extras[name] | {""}]
                if req.marker and not any(req.marker.evaluate(env) for env in envs):
                    continue
                applied.append(req)
                own = extras.setdefault(norm(req.name), set())
                if not req.extras <= own:
                    own |= req.extras
                    changed = True
    wanted: dict[str, SpecifierSet] = {}
    for req in applied:
        name = norm(req.name)
        wanted[name] = wanted.get(name, SpecifierSet()) & req.specifier
    return wanted


def plan(
    new: list[dict[str, Any]], base: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The closure's packages that must travel: torch, and each triton / nvidia-* / cuda-*
    package whose base version does not satisfy the new closure's requirements."""
    from packaging.version import Version

    wanted = requirements(new)
    base_versions = {norm(it["metadata"]["name"]): it["metadata"]["version"] for it in base}
    ship = []
    for it in new:
        name = norm(it["metadata"]["name"])
        if not name.startswith(SHIPPED_FAMILIES):
            continue
        have = base_versions.get(name)
        spec = wanted.get(name)
        if (
            name == "torch"
            or have is None
            or (spec is not None and not spec.contains(Version(have), True))
        ):
            ship.append(it)
    return ship, wanted


def download(ship: list[dict[str, Any]], folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for it in ship:
        path = folder / it["download_info"]["url"].rsplit("/", 1)[1]
        if not path.exists():
            cmd = pip("download", "-q", "--no-deps", *DEVICE_WHEELS)
            cmd += ["--index-url", INDEX, "-d", str(folder)]
            cmd.append(f"{it['metadata']['name']}=={it['metadata']['version']}")
            if subprocess.run(cmd).returncode != 0 or not path.exists():
                fail(f"could not download {path.name} from PyPI (see above)")
        paths.append(path)
    return paths


class Parts:
    """A write-only stream cut into files of at most `size` bytes: parts/t001, t002, ..."""

    def __init__(self, folder: Path, size: int) -> None:
        self.folder, self.size = folder, size
        self.names: list[str] = []
        self.left = 0
        self.file: Any = None

    def write(self, data: bytes) -> int:
        view = memoryview(data)
        while view:
            if self.left == 0:
                self._next()
            n = min(self.left, len(view))
            self.file.write(view[:n])
            self.left -= n
            view = view[n:]
        return len(data)

    def _next(self) -> None:
        if self.file:
            self.file.close()
        self.names.append(f"t{len(self.names) + 1:03d}")
        self.file = open(self.folder / self.names[-1], "wb")
        self.left = self.size

    def close(self) -> None:
        if self.file:
            self.file.close()


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def pack(wheels: list[Path], device: Path, part_bytes: int) -> list[Path]:
    """The wheels as one uncompressed tar stream (wheels are zips already), in parts."""
    folder = device / "torch-parts"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    parts = Parts(folder, part_bytes)
    with tarfile.open(fileobj=parts, mode="w|", format=tarfile.GNU_FORMAT) as tar:  # type: ignore[call-overload]
        for wheel in wheels:
            tar.add(wheel, arcname=wheel.name)
    parts.close()
    return [folder / name for name in parts.names]


def calls(parts: list[Path], label: str) -> list[str]:
    n = len(parts)
    lines = [
        f"# {label}: {n} parts. Make these run() calls back to back: the machine is given back",
        f"# 30 s after a call, and everything lives in {STAGE_DIR} on the device while it is warm.",
    ]
    for i, part in enumerate(parts, 1):
        carry = [f".device/torch-parts/{part.name}", ".device/bin"]
        cmd = "bash .device/bin/torch-site.sh park"
        if i == 1:
            cmd = f"rm -rf {STAGE_DIR}; {cmd}"
            carry.insert(1, ".device/torch")
        if i == n:
            cmd += " && bash .device/bin/torch-site.sh install"
        timeout = ", timeout_s=600" if i == n else ""
        lines.append(f"run(command={json.dumps(cmd)}, carry={json.dumps(carry)}{timeout})")
    lines += [
        "# Then vLLM's calls (stage.sh: .device/CALLS.txt), keeping this torch; its last call:",
        "#   bash .device/bin/torch-site.sh vllm-install && bash .device/bin/torch-site.sh run \\",
        "#     bash .device/bin/on-device.sh run python3 -m pytest tests/gpu -x -q",
        "# later calls: bash .device/bin/torch-site.sh run bash .device/bin/on-device.sh run CMD",
    ]
    return lines


def write_manifest(
    device: Path, torch: str, wheels: list[Path], parts: list[Path], needs: list[str], label: str
) -> None:
    meta = device / "torch"
    shutil.rmtree(meta, ignore_errors=True)
    meta.mkdir(parents=True)
    (meta / "TORCH_VERSION").write_text(torch + "\n")
    (meta / "parts.sha256").write_text("".join(f"{sha256(p)}  {p.name}\n" for p in parts))
    (meta / "wheels.sha256").write_text("".join(f"{sha256(w)}  {w.name}\n" for w in wheels))
    (meta / "needs.txt").write_text("".join(line + "\n" for line in needs))
    (meta / "CALLS.txt").write_text("\n".join(calls(parts, label)) + "\n")
    (device / "bin").mkdir(parents=True, exist_ok=True)
    shutil.copy(DEVICE_SCRIPT, device / "bin" / "torch-site.sh")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("vllm", nargs="?", help="the vLLM release whose torch pin to stage")
    ap.add_argument("--torch", help="the torch version to stage (instead of a vLLM release's pin)")
    ap.add_argument(
        "--base", default=BASE_TORCH, help="the device image's torch (default %(default)s)"
    )
    ap.add_argument(
        "--cache",
        type=Path,
        default=Path(os.environ.get("STAGE_TORCH_CACHE", "~/.cache/stage-torch")),
    )
    ap.add_argument(
        "--out", type=Path, default=ROOT / ".device", help="default: .device/ of the repository"
    )
    ap.add_argument("--part-bytes", type=int, default=60_000_000)
    ap.add_argument("--wheels", type=Path, help="pack the wheels in this folder; no network")
    args = ap.parse_args(argv)
    if not args.vllm and not args.torch:
        ap.error("name a vLLM release (e.g. 0.34.0) or pass --torch VERSION")
    if not 0 < args.part_bytes <= 62_000_000:
        ap.error("--part-bytes must be 1..62000000: a device call carries 64 MiB with .device/bin")
    cache = args.cache.expanduser()
    cache.mkdir(parents=True, exist_ok=True)
    torch = args.torch or vllm_torch(args.vllm, cache)
    label = f"torch {torch}" + (f" for vLLM {args.vllm}" if args.vllm else "")
    if args.wheels:
        wheels = sorted(args.wheels.glob("*.whl"))
        if not wheels:
            fail(f"no .whl files in {args.wheels}")
        needs: list[str] = []
    else:
        if torch == args.base:
            fail(f"torch {torch} is the device image's: stage.sh alone is enough")
        new = report(f"torch=={torch}", cache)
        ship, wanted = plan(new, report(f"torch=={args.base}", cache))
        base = {
            norm(it["metadata"]["name"]): it["metadata"]["version"]
            for it in report(f"torch=={args.base}", cache)
        }
        print(f"{label}: {'package':24} {'version':12} {args.base + ' has':14} travels")
        for it in new:
            name, version = norm(it["metadata"]["name"]), it["metadata"]["version"]
            if name.startswith(SHIPPED_FAMILIES):
                travels = "yes" if it in ship else "no"
                print(f"  {name:24} {version:12} {base.get(name, '-'):14} {travels}")
        wheels = download(ship, cache / "wheels")
        needs = sorted(
            f"{name} {spec}".strip()
            for name, spec in wanted.items()
            if name.startswith(SHIPPED_FAMILIES)
        )
    parts = pack(wheels, args.out, args.part_bytes)
    write_manifest(args.out, torch, wheels, parts, needs, label)
    total = sum(p.stat().st_size for p in parts)
    for w in wheels:
        print(f"  {w.name}: {w.stat().st_size:,} bytes")
    print(
        f"{label}: {len(wheels)} wheels, {total:,} bytes"
        f" in {len(parts)} parts of <= {args.part_bytes:,}"
    )
    print(f"device calls: {len(parts)} (see {args.out / 'torch' / 'CALLS.txt'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
