"""Stage vLLM, speculators and this project for the GPU machine, and write the run() calls.

The GPU jobs that train through speculators (acceptance/, backends/, seed_job/) need vLLM's
wheel in parts, vLLM's and the API server's dependencies, speculators 0.9.0 and its own, and
speculators' `scripts/launch_vllm.py`: about 275 MB, where one call carries 64 MiB with the
working tree. Run here, from the repository root (the network is here, none there):

    python benchmarks/stage_speculators.py --launcher-from ~/speculators [--vllm 0.20.1]
        [--extra DIR] [--job "bash benchmarks/acceptance/loop.sh start && ..."]

1. `.device/device-deps.txt` = ../shared/device/device-deps.txt + tests/gpu/serve-deps.txt, then
   `../shared/device/stage.sh VER`: the vLLM parts `.device/p1..`, their wheels, this project's;
2. the wheels of tests/gpu/speculators-deps.txt (and any `--extra DIR` of wheels, Mooncake's);
3. `.device/launch_vllm.py` from a speculators clone (`git show HEAD:scripts/launch_vllm.py`);
4. every wheel but this project's packed into the calls, largest first: each part's park call
   takes what fits beside its part, the last call (install, then the job) what fits beside this
   project's wheel and launch_vllm.py, and calls of wheels alone go between when needed. Folders
   `.device/c1..`, one per call; `.device/CALLS.txt` lists the calls to make back to back.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.stage_torch import DEVICE_WHEELS, INDEX, pip  # noqa: E402

LIMIT = 64 << 20  # what one call carries, the working tree included
MARGIN = 1 << 20  # files the tree gains between staging and the call
PARK = "bash .device/bin/on-device.sh park"
INSTALL = (
    "bash .device/bin/on-device.sh install > /tmp/stash/install.log 2>&1; "
    "tail -3 /tmp/stash/install.log"
)
DEFAULT_JOB = "bash .device/bin/on-device.sh run python3 -m pytest tests/gpu -x -q"


@dataclass
class Call:
    carry: list[str]
    room: int  # bytes left for wheels
    wheels: list[Path] = field(default_factory=list)


def fail(message: str) -> int:
    print(f"stage_speculators: {message}", file=sys.stderr)
    return 2


def size(paths: list[Path]) -> int:
    return sum(f.stat().st_size for p in paths for f in ([p] if p.is_file() else p.rglob("*")))


def tree_bytes(root: Path) -> int:
    """The working tree a call sends: tracked files and untracked ones git does not ignore."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "-co", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    return sum(
        (root / n.decode()).stat().st_size for n in listed if n and (root / n.decode()).is_file()
    )


def pack(device: Path, wheels: list[Path], tree: int) -> list[Call]:
    """The calls in order: one park call per vLLM part, wheel-only calls if needed, the install
    call last; each wheel in exactly one, no call over LIMIT. ValueError for a wheel too big."""
    free = LIMIT - MARGIN - tree
    fixed = [device / "bin"]
    parts = sorted(device.glob("p[0-9]*"), key=lambda p: int(p.name[1:]))
    calls = []
    for i, part in enumerate(parts):
        extra = [device / "parts.sha256", device / "VLLM_VERSION"] if i == 0 else []
        calls.append(Call([str(p.relative_to(device.parent)) for p in (part, *fixed, *extra)], 0))
        calls[-1].room = free - size([part, *fixed, *extra])
        if calls[-1].room < -MARGIN:
            raise ValueError(f"{part.name} with a working tree of {tree:,} B is over a call")
    ours = list((device / "wheels").glob("speculators_hybrid-*.whl"))  # the rest is packed
    last = [device / "wheels", device / "launch_vllm.py", *fixed]
    room = free - size([*ours, device / "launch_vllm.py", *fixed])
    install = Call([str(p.relative_to(device.parent)) for p in last], room)
    alone: list[Call] = []  # calls of wheels alone, opened as needed
    for wheel in sorted(wheels, key=lambda w: -w.stat().st_size):
        need = wheel.stat().st_size
        home = next((c for c in [*calls, install, *alone] if c.room >= need), None)
        if home is None:
            home = Call([str((device / "bin").relative_to(device.parent))], free - size(fixed))
            if home.room < need:
                raise ValueError(f"{wheel.name} ({need:,} B) is larger than a call carries")
            alone.append(home)
        home.wheels.append(wheel)
        home.room -= need
    return [*calls, *alone, install]


def place(device: Path, calls: list[Call]) -> None:
    """Copy each call's wheels into its own folder .device/cK and add that folder to its carry;
    .device/wheels keeps this project's wheel alone (the install call carries it)."""
    for old in device.glob("c[0-9]*"):
        shutil.rmtree(old)
    for k, call in enumerate(calls, 1):
        if not call.wheels:
            continue
        folder = device / f"c{k}"
        folder.mkdir()
        for wheel in call.wheels:
            shutil.copy2(wheel, folder / wheel.name)
        call.carry.insert(1, f".device/c{k}")
    for wheel in (device / "wheels").glob("*.whl"):
        if not wheel.name.startswith("speculators_hybrid-"):
            wheel.unlink()


def lines(calls: list[Call], job: str) -> list[str]:
    out = ["# back to back: the machine is given back 30 s after a call ends"]
    for k, call in enumerate(calls, 1):
        take = f"mkdir -p /tmp/stash/wheels && cp .device/c{k}/*.whl /tmp/stash/wheels/ && "
        last = k == len(calls)
        command = (take if call.wheels else "") + (f"{INSTALL}; {job}" if last else PARK)
        timeout = ", timeout_s=600" if last else ", timeout_s=120"
        out.append(f"run(command={json.dumps(command)}, carry={json.dumps(call.carry)}{timeout})")
    return out


def download(requirements: Path, folder: Path) -> None:
    names = [x for x in requirements.read_text().splitlines() if x.strip() and x[0] != "#"]
    folder.mkdir(parents=True, exist_ok=True)
    cmd = pip("download", "-q", "--no-deps", *DEVICE_WHEELS, "--index-url", INDEX)
    subprocess.run([*cmd, "-d", str(folder), *names], check=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm", default="0.20.1", help="the vLLM release (0.20.x-0.26.0)")
    parser.add_argument("--launcher-from", type=Path, help="a speculators clone")
    parser.add_argument("--extra", type=Path, action="append", default=[], help="more wheels")
    parser.add_argument("--job", default=DEFAULT_JOB, help="what the last call runs")
    parser.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "device")
    args = parser.parse_args(argv)
    device = ROOT / ".device"
    clone = args.launcher_from
    if clone and not (clone / ".git").exists() and not (clone / "HEAD").is_file():
        return fail(f"{clone} is not a git clone of speculators: pass one with scripts/")
    if not clone and not (device / "launch_vllm.py").is_file():
        return fail("no .device/launch_vllm.py: pass --launcher-from a speculators clone")
    if not (args.shared / "stage.sh").is_file():
        return fail(f"no stage.sh in {args.shared}: pass --shared ../shared/device")
    for extra in args.extra:
        if not list(extra.glob("*.whl")):
            return fail(f"--extra {extra}: no wheels there")
    device.mkdir(exist_ok=True)
    deps = [args.shared / "device-deps.txt", ROOT / "tests/gpu/serve-deps.txt"]
    names = {
        x.strip() for p in deps for x in p.read_text().splitlines() if x.strip()[:1] not in "#"
    }
    (device / "device-deps.txt").write_text("".join(f"{n}\n" for n in sorted(names)))
    subprocess.run(["bash", str(args.shared / "stage.sh"), args.vllm], cwd=ROOT, check=True)
    spec = device / "spec"
    shutil.rmtree(spec, ignore_errors=True)
    download(ROOT / "tests/gpu/speculators-deps.txt", spec)
    if clone:
        text = subprocess.run(
            ["git", "-C", str(clone), "show", "HEAD:scripts/launch_vllm.py"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        (device / "launch_vllm.py").write_text(text)
    ours = {w.name for w in (device / "wheels").glob("speculators_hybrid-*.whl")}
    wheels = {w.name: w for w in (device / "wheels").glob("*.whl") if w.name not in ours}
    for folder in (spec, *args.extra):
        wheels |= {w.name: w for w in folder.glob("*.whl") if w.name not in wheels}
    try:
        calls = pack(device, list(wheels.values()), tree_bytes(ROOT))
    except ValueError as exc:
        return fail(str(exc))
    place(device, calls)
    shutil.rmtree(spec, ignore_errors=True)
    text = "\n".join(lines(calls, args.job)) + "\n"
    (device / "CALLS.txt").write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
