"""benchmarks/acceptance/table.py on the first GPU run's committed results."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "acceptance"))

import table  # noqa: E402

RUN1 = ROOT / "benchmarks" / "acceptance" / "results" / "2026-12-06-vllm0.20.1-h100"


def test_rows_in_loop_order_with_ratios_and_the_refusal() -> None:
    lines = table.table(RUN1).splitlines()
    names = [line.split(" | ")[0].lstrip("| ") for line in lines[2:]]
    assert names == ["target", "eagle3", "dflash", "dflash-1d"]
    assert "| 0.294, 0.101, 0.037 | 1.43 | 2,527 / 70.8 | 0.66x / 0.86x |" in lines[3]
    assert "not served" in lines[4]


def test_bad_folder_is_one_line(tmp_path: Path, capsys) -> None:
    assert table.main([str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err.count("\n") == 1
