"""benchmarks/timeline_upstream.py on vLLM's own connector (vLLM >= 0.24), built by vLLM's
factory from the benchmark's settings: each file leaves one timeline entry, its times in order,
the file still written whole (with our provenance while the plugin is on), and the connector's
`get_finished` is timed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import engine_config, needs
from upstream_worker import (  # noqa: F401 (cpu_copies: a fixture)
    READS_IN_FORWARD,
    cpu_copies,
    extract,
    extraction,
    load,
    storage,
)

from speculators_hybrid import planning

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
pytestmark = [
    needs("hidden-states-provenance"),
    pytest.mark.skipif(READS_IN_FORWARD, reason="vLLM 0.22-0.23 copy in the forward pass"),
    pytest.mark.usefixtures("cpu_copies"),
]


def test_each_file_leaves_its_times(shim, tmp_path, monkeypatch):
    import torch

    from benchmarks import engine, timeline_upstream

    monkeypatch.setattr(timeline_upstream, "_log", None)
    for owner, method in timeline_upstream.UPSTREAM_TIMED:  # put back what it times
        try:
            cls = timeline_upstream.owner_class(owner)
        except (ImportError, AttributeError):  # not in this release (0.34: no V1 runner)
            continue
        monkeypatch.setattr(cls, method, getattr(cls, method))
    config = engine_config(preset="tiny", ids=(2, 5, 8), max_model_len=4096)
    storage(config, tmp_path / "files")
    transfer = config.kv_transfer_config
    transfer.kv_connector = "TimelineConnector"
    transfer.kv_connector_module_path = engine.UPSTREAM_TIMELINE
    kv = planning.plan(config, planning.layer_specs(config), 64 << 20)
    with extraction(config, kv) as ex:
        assert type(ex.worker) is timeline_upstream.TimelineConnector
        paths = [
            extract(ex, f"r{i}", torch.randn(n, 3, 256))["hidden_states_path"]
            for i, n in enumerate((40, 17))
        ]
        files = [load(p) for p in paths]  # waits for each writer on the lock
    assert [f["token_ids"].tolist() for f in files] == [list(range(1, 41)), list(range(1, 18))]

    lines = [json.loads(x) for x in (tmp_path / "files.timeline.jsonl").read_text().splitlines()]
    rows = [r for r in lines if "path" in r]
    assert sorted(r["path"] for r in rows) == sorted(paths)
    for r in rows:
        assert r["submitted"] <= r["started"] <= r["copied"] <= r["written"]
    calls = {r["call"] for r in lines if "call" in r}
    assert "TimelineConnector.get_finished" in calls
    summary = engine.timeline(tmp_path / "files.timeline.jsonl", rows[0]["submitted"], 0.0)
    assert summary is not None and summary["files"] == 2
