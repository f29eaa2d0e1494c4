"""benchmarks/timeline.py on our real connector and writer: every file leaves one timeline
entry, its times in order, and the file is still written whole."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from conftest import needs
from safetensors.torch import load_file
from test_connector_worker import async_connector

from speculators_hybrid.vllm_patches import writer
from speculators_hybrid.vllm_patches.connector import HiddenStatesMetadata, SaveRequest, slots_for

pytestmark = needs("keep-hma-for-extraction")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def undo_afterwards(monkeypatch, timeline) -> None:
    """What `timeline._install` replaces, put back after the test."""
    for name in ("_write", "_timeline_log"):
        monkeypatch.setattr(writer, name, getattr(writer, name, None), raising=False)
    monkeypatch.setattr(writer.FileWriter, "submit", writer.FileWriter.submit)
    for owner, method in timeline.HOST_TIMED:
        cls = timeline.owner_class(owner)
        monkeypatch.setattr(cls, method, getattr(cls, method))


def test_each_file_leaves_its_times(shim, tmp_path, monkeypatch):
    from benchmarks import timeline

    undo_afterwards(monkeypatch, timeline)
    connector, name, cache = async_connector(tmp_path / "files", kind=timeline.TimelineConnector)
    saves = [
        SaveRequest(f"r{i}", str(tmp_path / "files" / f"r{i}.safetensors"), [1, 2], slots)
        for i, slots in enumerate([slots_for([1], 16, 2), slots_for([2], 16, 2)])
    ]
    connector.bind_connector_metadata(HiddenStatesMetadata(saves))
    connector.save_kv_layer(name, cache, None)
    connector.shutdown()

    log = (tmp_path / "files.timeline.jsonl").read_text()
    lines = [json.loads(line) for line in log.splitlines()]
    rows = [r for r in lines if "path" in r]
    assert sorted(r["path"] for r in rows) == [s.path for s in saves]
    calls = [r for r in lines if "call" in r]
    assert [r["call"] for r in calls] == ["TimelineConnector.save_kv_layer"]
    assert calls[0]["host_s"] > 0
    for r in rows:
        assert r["submitted"] <= r["started"] <= r["copied"] <= r["written"]
        assert load_file(r["path"])["token_ids"].tolist() == [1, 2]


def test_every_timed_call_exists_and_is_timed(shim, tmp_path, monkeypatch):
    """The step's parts that timeline.py times are there in this vLLM release (a rename would
    silently drop one from the JSON)."""
    from benchmarks import timeline

    undo_afterwards(monkeypatch, timeline)
    async_connector(tmp_path / "files", kind=timeline.TimelineConnector)[0].shutdown()
    for owner, method in timeline.HOST_TIMED:
        timed = getattr(timeline.owner_class(owner), method)
        assert hasattr(timed, "__wrapped__"), f"{owner}.{method} is not timed"
