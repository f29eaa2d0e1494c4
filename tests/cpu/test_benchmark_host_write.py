"""benchmarks/host_write.py: the writer path's files, side by side, timed and then removed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def test_each_thread_count_writes_its_files_and_leaves_none(tmp_path):
    from benchmarks import host_write

    args = host_write.parse_args(
        ["--folder", str(tmp_path / "hw"), "--threads", "1", "3", "--file-mb", "0.5"]
    )
    result = host_write.run(args)
    runs = [(r["how"], r["threads"], r["files"]) for r in result["runs"]]
    assert runs == [(h, t, 2 * t) for h in host_write.HOW for t in (1, 3)]
    assert result["file_bytes"] == 12 * host_write.ROW_BYTES  # 0.5 MB in whole token rows
    assert all(r["gb_per_s"] > 0 and r["max_file_s"] >= r["mean_file_s"] for r in result["runs"])
    for r in result["runs"]:  # the main thread's longest wait for the GIL, within the run
        assert 0 <= r["main_thread_max_wait_ms"] <= r["seconds"] * 1e3  # 0: done before a look
    assert result["safetensors"].count(".") >= 1  # the version whose save_file was measured
    assert not (tmp_path / "hw" / "run").exists()


def test_each_main_thread_and_repeat_is_a_run(tmp_path):
    from benchmarks import host_write

    args = host_write.parse_args(
        ["--folder", str(tmp_path / "hw"), "--threads", "2", "--file-mb", "0.5", "--how",
         "save_whole", "--main-thread", "op", "python", "--repeat", "2"]
    )  # fmt: skip
    runs = [(r["main_thread"], r["how"], r["files"]) for r in host_write.run(args)["runs"]]
    assert runs == [("op", "save_whole", 4)] * 2 + [("python", "save_whole", 4)] * 2


def test_bad_settings_are_refused_in_one_line(capsys):
    from benchmarks import host_write

    for bad in (["--threads", "0"], ["--repeat", "0"]):
        with pytest.raises(SystemExit):
            host_write.parse_args(bad)
        assert "--threads, --files-per-thread and --repeat must be >= 1" in capsys.readouterr().err
