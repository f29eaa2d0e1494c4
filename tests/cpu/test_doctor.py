"""`doctor` on the CPU: vLLM's own plans side by side, and the JSON schema docs/doctor.md gives."""

from __future__ import annotations

import json

import pytest
from conftest import IDS, model_dir

from speculators_hybrid.cli import main


@pytest.mark.full_tier  # doctor runs vLLM three times; the plans themselves are decisive-tier
def test_doctor_json_shows_the_memory_target_met(shim, capsys):
    assert main(["doctor", model_dir("qwen3.6-27b-like"), "--json"]) == 0
    text = capsys.readouterr().out
    # vLLM's logger in this process was set up before the CLI ran; the JSON is the last block.
    out = json.loads(text[text.rindex("\n{\n") + 1 :] if not text.startswith("{") else text)
    assert out["schema"] == 1
    assert out["setup"]["layer_ids"] == list(IDS)  # speculators' default for n = 64
    assert [p["name"] for p in out["plans"]] == ["no-extraction", "stock", "shim"]
    plain, stock, ours = out["plans"]
    assert plain["ok"] and ours["ok"]
    assert out["bytes"]["hidden_bytes_per_token"] == len(IDS) * 5120 * 2
    assert out["bytes"]["attention_layers"] == 16 and out["bytes"]["state_layers"] == 48
    target = plain["request_bytes"] + out["bytes"]["hidden_bytes_per_token"] * 262144
    assert out["request_target_bytes"] == target
    assert ours["request_bytes"] <= 1.05 * target
    assert out["ratio_to_target"]["shim"] <= 1.05
    if stock["ok"]:  # vLLM >= 0.22 starts, billing the hidden group at the widest group's width
        assert out["ratio_to_target"]["stock"] > 5
    else:  # < 0.22 cannot plan it; 0.33 refuses it for memory (416 GiB needed, 6.7x target)
        assert "unified type" in stock["error"] or "KV cache is needed" in stock["error"]
    kinds = {g["kind"]: g for g in ours["groups"]}
    # vLLM < 0.22 (prefix caching off): the engine's layout, vLLM's groups of 16 + 16 hidden
    # slices (hidden-states-wide-group); else one-layer groups (hidden-states-own-page-size)
    width = 16 if "hidden-states-wide-group" in ours["patches"] else 1
    assert all(g["layers"] == width for g in ours["groups"])
    assert kinds["MambaSpec"]["count"] == 48 // width
    assert kinds["FullAttentionSpec"]["count"] == 16 // width
    assert sum(g["count"] for g in ours["groups"]) == 64 // width + 1
    assert "hidden-states-own-page-size" in ours["patches"]
