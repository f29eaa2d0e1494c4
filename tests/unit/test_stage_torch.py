"""benchmarks/stage_torch.py and its device side, benchmarks/torch_site.sh, on small fake wheels.

The parts must join back into the same wheels, a corrupt or missing part must stop the join with
a message, the calls must carry one part each, and `torch-site.sh run` must put the staged site
before any other torch. plan() is checked on small resolutions shaped like pip's reports.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import stage_torch  # noqa: E402

SCRIPT = ROOT / "benchmarks" / "stage_torch.py"


def stage(tmp_path: Path, part_bytes: int = 4093) -> tuple[Path, dict[str, bytes]]:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    contents = {
        "torch-9.9.9-cp312-cp312-manylinux_2_28_x86_64.whl": os.urandom(10_000),
        "nvidia_x-2.0-py3-none-manylinux_2_27_x86_64.whl": os.urandom(5_000),
        "cuda_toolkit-1.0-py3-none-any.whl": b"tiny",
    }
    for name, data in contents.items():
        (wheels / name).write_bytes(data)
    repo = tmp_path / "repo"
    cmd = [sys.executable, str(SCRIPT), "--torch", "9.9.9", "--wheels", str(wheels)]
    cmd += [
        "--out",
        str(repo / ".device"),
        "--part-bytes",
        str(part_bytes),
        "--cache",
        str(tmp_path / "c"),
    ]
    subprocess.run(cmd, check=True, capture_output=True)
    return repo, contents


def device(repo: Path, tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "TORCH_STAGE": str(tmp_path / "stage"), **env}
    cmd = ["bash", ".device/bin/torch-site.sh", *args]
    return subprocess.run(cmd, cwd=repo, env=environ, capture_output=True, text=True)


def test_parts_round_trip(tmp_path: Path) -> None:
    repo, contents = stage(tmp_path)
    parts = sorted((repo / ".device" / "torch-parts").iterdir())
    assert len(parts) >= 4 and all(p.stat().st_size <= 4093 for p in parts)
    calls = [
        line
        for line in (repo / ".device/torch/CALLS.txt").read_text().splitlines()
        if line.startswith("run(")
    ]
    assert len(calls) == len(parts)
    assert '.device/torch"' in calls[0] and "rm -rf /tmp/torch-stage" in calls[0]
    assert all(f'".device/torch-parts/{p.name}"' in c for p, c in zip(parts, calls, strict=True))
    assert calls[-1].count("torch-site.sh install") == 1
    assert device(repo, tmp_path, "park").returncode == 0
    done = device(repo, tmp_path, "unpack")
    assert done.returncode == 0, done.stderr
    for name, data in contents.items():
        assert (tmp_path / "stage" / "wheels" / name).read_bytes() == data


def test_corrupt_or_missing_part_stops_the_join(tmp_path: Path) -> None:
    repo, _ = stage(tmp_path)
    assert device(repo, tmp_path, "park").returncode == 0
    parked = tmp_path / "stage" / "parts"
    second = parked / "t002"
    data = bytearray(second.read_bytes())
    data[100] ^= 1
    second.write_bytes(bytes(data))
    done = device(repo, tmp_path, "install")
    assert done.returncode == 11 and "corrupt" in done.stderr
    assert not (tmp_path / "stage" / "site").exists()
    second.unlink()
    done = device(repo, tmp_path, "unpack")
    assert done.returncode == 10 and "t002" in done.stderr


def test_park_names_a_part_that_came_corrupt(tmp_path: Path) -> None:
    repo, _ = stage(tmp_path)
    third = repo / ".device" / "torch-parts" / "t003"
    third.write_bytes(third.read_bytes()[:-1])
    done = device(repo, tmp_path, "park")
    assert done.returncode == 11 and "t003" in done.stderr
    assert not (tmp_path / "stage" / "parts" / "t003").exists()


def test_nothing_parked(tmp_path: Path) -> None:
    repo, _ = stage(tmp_path)
    done = device(repo, tmp_path, "install")
    assert done.returncode == 9 and "start again" in done.stderr


def test_run_puts_the_staged_site_first(tmp_path: Path) -> None:
    repo, _ = stage(tmp_path)
    for folder, version in (
        ((tmp_path / "stage" / "site"), "9.9.9"),
        ((tmp_path / "image"), "2.11.0"),
    ):
        (folder / "torch").mkdir(parents=True)
        (folder / "torch" / "__init__.py").write_text(f"__version__ = {version!r}\n")
    code = "import torch; print(torch.__version__)"
    done = device(repo, tmp_path, "run", "python3", "-c", code, PYTHONPATH=str(tmp_path / "image"))
    assert done.stdout.strip() == "9.9.9", done.stderr


def test_bad_arguments_say_what_to_do(tmp_path: Path) -> None:
    for args in ([], ["--torch", "2.14.0", "--part-bytes", "70000000"]):
        done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)
        assert done.returncode == 2 and "Traceback" not in done.stderr
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--torch", "1", "--wheels", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert (
        done.returncode == 2 and "no .whl files" in done.stderr and "Traceback" not in done.stderr
    )


def item(name: str, version: str, *requires: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "version": version, "requires_dist": list(requires)}}


def test_plan_ships_what_the_image_does_not_satisfy() -> None:
    extra = "; platform_system == 'Linux' and extra == '{}'"
    new = [
        item(
            "torch",
            "2.14.0",
            "kit[a]==2 ; platform_system == 'Linux'",
            "triton~=3.8.0",
            "nvidia-nccl-cu13==2.30.7",
        ),
        item(
            "kit",
            "2",
            "nvidia-cublas==13.1.1.3.*" + extra.format("a"),
            "nvidia-nvjitlink<14,>=13.0.88" + extra.format("a"),
            "nvidia-nvvm==13.0.88.*" + extra.format("all"),
        ),
        item("triton", "3.8.0"),
        item("nvidia-nccl-cu13", "2.30.7"),
        item("nvidia-cublas", "13.1.1.3"),
        item("nvidia-nvjitlink", "13.5.37"),
        item("nvidia-cufft", "12.0.0.61"),
        item("sympy", "1.14.0"),
    ]
    base = [
        item("torch", "2.11.0"),
        item("triton", "3.6.0"),
        item("nvidia-nccl-cu13", "2.28.9"),
        item("nvidia-cublas", "13.1.0.3"),
        item("nvidia-nvjitlink", "13.0.88"),
        item("nvidia-cufft", "12.0.0.61"),
        item("sympy", "1.13.0"),
        item("kit", "2"),
    ]
    ship, wanted = stage_torch.plan(new, base)
    assert [it["metadata"]["name"] for it in ship] == [
        "torch",
        "triton",
        "nvidia-nccl-cu13",
        "nvidia-cublas",
    ]
    assert "nvidia-nvvm" not in wanted  # only under an extra nobody asked for
    assert str(wanted["nvidia-nvjitlink"]) == "<14,>=13.0.88"
