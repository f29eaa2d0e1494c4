"""benchmarks/stage_speculators.py's packing: every wheel travels once, no call over a call's
64 MiB with the working tree, the install call last (sizes of the 2026-12-07 staging)."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location(
    "stage_speculators", ROOT / "benchmarks/stage_speculators.py"
)
assert spec and spec.loader
stage = importlib.util.module_from_spec(spec)
sys.modules["stage_speculators"] = stage  # dataclasses look their module up
spec.loader.exec_module(stage)

TREE = 5_062_884
PARTS = {"p1": 42_000_000, "p2": 61_000_000, "p3": 54_643_947}
WHEELS = {"pyarrow": 53_756_000, "pandas": 11_752_000, "pycountry": 7_860_000}
WHEELS |= {"torchvision": 7_348_000, "mistral_common": 6_436_000}
WHEELS |= {f"small{i}": 300_000 + 7_919 * i for i in range(90)}


def sparse(path: Path, size: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        f.truncate(size)
    return path


@pytest.fixture
def device(tmp_path: Path) -> Path:
    device = tmp_path / ".device"
    for name, size in PARTS.items():
        sparse(device / name, size)
    sparse(device / "bin" / "on-device.sh", 3_000)
    sparse(device / "parts.sha256", 400)
    sparse(device / "VLLM_VERSION", 7)
    sparse(device / "launch_vllm.py", 6_000)
    sparse(device / "wheels" / "speculators_hybrid-0.1.0-py3-none-any.whl", 973_508)
    return device


def wheels(device: Path) -> list[Path]:
    return [sparse(device / "wheels" / f"{n}-1-py3-none-any.whl", s) for n, s in WHEELS.items()]


def test_each_wheel_once_and_no_call_over_the_limit(device: Path) -> None:
    calls = stage.pack(device, wheels(device), TREE)
    placed = [w.name for c in calls for w in c.wheels]
    assert sorted(placed) == sorted(f"{n}-1-py3-none-any.whl" for n in WHEELS)
    root = device.parent
    for call in calls:
        carried = stage.size([root / c for c in call.carry if c != ".device/wheels"])
        ours = 973_508 if ".device/wheels" in call.carry else 0
        total = TREE + carried + ours + stage.size(call.wheels)
        assert total <= stage.LIMIT - (stage.MARGIN if call.wheels else 0)
    assert [c.carry[0] for c in calls[:3]] == [".device/p1", ".device/p2", ".device/p3"]
    assert ".device/parts.sha256" in calls[0].carry and ".device/launch_vllm.py" in calls[-1].carry
    assert len(calls) == 5  # three parts, one call of wheels alone, the install


def test_calls_name_each_folder_and_install_last(device: Path) -> None:
    extra = sparse(device.parent / "mc" / "mooncake-1-py3-none-any.whl", 20_000_000)
    calls = stage.pack(device, [*wheels(device), extra], TREE)
    stage.place(device, calls)
    assert extra.exists()  # an --extra folder is copied from, so a second staging finds it
    text = stage.lines(calls, "JOB")
    assert len(text) == 1 + len(calls)
    for k, (line, call) in enumerate(zip(text[1:], calls, strict=True), 1):
        found = re.search(r"carry=(\[.*?\])", line)
        assert found, line
        carry = json.loads(found.group(1))
        assert (f".device/c{k}" in carry) == bool(call.wheels)
        if call.wheels:
            assert sorted(p.name for p in (device / f"c{k}").iterdir()) == sorted(
                w.name for w in call.wheels
            )
            assert f"cp .device/c{k}/*.whl /tmp/stash/wheels/" in line
    assert "on-device.sh install" in text[-1] and text[-1].count("JOB") == 1
    assert all("on-device.sh park" in line for line in text[1:-1])
    assert [p.name for p in (device / "wheels").iterdir()] == [
        "speculators_hybrid-0.1.0-py3-none-any.whl"
    ]


def test_a_wheel_or_part_no_call_can_carry_is_refused(device: Path) -> None:
    big = sparse(device / "wheels" / "huge-1-py3-none-any.whl", 66_000_000)
    with pytest.raises(ValueError, match="huge-1-py3-none-any.whl"):
        stage.pack(device, [big], TREE)
    with pytest.raises(ValueError, match="p2 with a working tree of 8,000,000 B"):
        stage.pack(device, [], 8_000_000)


def test_a_folder_that_is_no_clone_is_one_line(tmp_path: Path, capsys) -> None:
    assert stage.main(["--launcher-from", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a git clone of speculators" in err
