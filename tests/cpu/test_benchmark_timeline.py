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


def test_each_file_leaves_its_times(shim, tmp_path, monkeypatch):
    from benchmarks import timeline

    for name in ("_write", "_timeline_log"):
        monkeypatch.setattr(writer, name, getattr(writer, name, None), raising=False)
    monkeypatch.setattr(writer.FileWriter, "submit", writer.FileWriter.submit)
    connector, name, cache = async_connector(tmp_path / "files", kind=timeline.TimelineConnector)
    saves = [
        SaveRequest(f"r{i}", str(tmp_path / "files" / f"r{i}.safetensors"), [1, 2], slots)
        for i, slots in enumerate([slots_for([1], 16, 2), slots_for([2], 16, 2)])
    ]
    connector.bind_connector_metadata(HiddenStatesMetadata(saves))
    connector.save_kv_layer(name, cache, None)
    connector.shutdown()

    log = (tmp_path / "files.timeline.jsonl").read_text()
    rows = [json.loads(line) for line in log.splitlines()]
    assert sorted(r["path"] for r in rows) == [s.path for s in saves]
    for r in rows:
        assert r["submitted"] <= r["started"] <= r["copied"] <= r["written"]
        assert load_file(r["path"])["token_ids"].tolist() == [1, 2]
