"""`doctor` on the CPU: vLLM's own plans side by side, and the JSON schema docs/doctor.md gives."""

from __future__ import annotations

import json

import pytest
from conftest import IDS, model_dir

from speculators_hybrid.cli import main


@pytest.mark.full_tier  # doctor runs vLLM three times; the plans themselves are decisive-tier
def test_doctor_json_shows_the_memory_target_met(shim, capsys):
    assert main(["doctor", model_dir("qwen3.6-27b"), "--json"]) == 0
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
    # the GDN layers' spare block is small beside 262,144 tokens: prefill-only saves little
    lean = out["prefill_only"]
    assert lean["ok"] and lean["request_bytes"] < ours["request_bytes"]
    assert lean["capacity_tokens"] > ours["capacity_tokens"]
    assert "prefill-only" not in out["verdict"]  # the shim plan already meets the target


@pytest.mark.full_tier
def test_doctor_names_prefill_only_where_the_spare_state_block_misses_the_target(
    shim, capsys, tmp_path
):
    """Nemotron-H 8B at 8,192 tokens: the spare Mamba block per request is a large part of it
    (test_family_planning.py); doctor shows the plan without it and the verdict names it."""
    from speculators_hybrid import families
    from speculators_hybrid.family_presets import PRESETS, write_family_config
    from speculators_hybrid.versions import installed

    why = families.refusal(PRESETS["nemotron-h-8b"]["model_type"], installed("vllm"))
    if why:
        pytest.skip(why)
    folder = write_family_config(tmp_path / "nemotron", "nemotron-h-8b")
    assert main(["doctor", str(folder), "--json"]) == 0
    text = capsys.readouterr().out
    out = json.loads(text[text.rindex("\n{\n") + 1 :] if not text.startswith("{") else text)
    assert out["ratio_to_target"]["shim"] > 1.05
    assert out["prefill_only"]["ratio_to_target"] <= 1.05
    assert "as `launch` runs it (prefill-only)" in out["verdict"]
