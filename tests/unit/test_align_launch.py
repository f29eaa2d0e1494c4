"""`launch` and Mamba align mode's start-up constraint (issue 17, item 3): what it does with the
check's answer. The answer itself comes from vLLM's planning (tests/cpu/test_align_mode.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from speculators_hybrid.launcher import LaunchError
from speculators_hybrid.launcher.adjust import align_mode_batch
from speculators_hybrid.launcher.target import Target

TARGET = Target("m", Path("/m/config.json"), {"model_type": "qwen3_5"})
SPEC = '{"draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": [2, 32]}}}'
REFUSED = {
    "mamba_cache_mode": "align",
    "block_size": 416,
    "max_num_batched_tokens": 256,
    "ok": False,
    "error": "AssertionError: In Mamba cache align mode, block_size (416) must be <= ...",
    "smallest_valid": 416,
}


def _argv(*extra: str) -> list[str]:
    return ["vllm", "serve", "m", "--speculative-config", SPEC, *extra]


def _checker(answer):
    seen = []

    def check(argv, target, batched):
        seen.append(batched)
        return answer

    return check, seen


def test_a_launcher_value_below_the_block_is_raised_and_logged():
    check, seen = _checker(REFUSED)
    logs: list[str] = []
    out = align_mode_batch(
        _argv("--max-num-batched-tokens", "256"), [], "0.20.1", TARGET, True, logs.append, check
    )
    assert seen == [256]
    assert out == _argv("--max-num-batched-tokens", "416")
    assert "raised --max-num-batched-tokens 256" in logs[0] and "416" in logs[0]
    out = align_mode_batch(
        _argv("--max_num_batched_tokens=256"), [], "0.20.1", TARGET, True, logs.append, check
    )
    assert out == _argv("--max_num_batched_tokens=416")


def test_a_user_value_below_the_block_is_a_one_line_error():
    check, _ = _checker(REFUSED)
    argv = _argv("--max-num-batched-tokens", "256")
    with pytest.raises(LaunchError) as err:
        align_mode_batch(
            argv, ["--", "--max-num-batched-tokens", "256"], "0.20.1", TARGET, True, print, check
        )
    assert "--max-num-batched-tokens 416" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "vllm, extra, plugin",
    [
        ("0.27.0", (), True),  # vLLM dropped the assertion
        ("0.20.1", ("--no-enable-prefix-caching",), True),  # no align mode
        ("0.20.1", (), False),  # no plugin: extraction does not start on 0.20 anyway
    ],
)
def test_no_check_where_vllm_does_not_refuse(vllm, extra, plugin):
    check, seen = _checker(REFUSED)
    argv = _argv("--max-num-batched-tokens", "256", *extra)
    assert align_mode_batch(argv, [], vllm, TARGET, plugin, print, check) == argv
    assert seen == []


def test_no_change_when_vllm_accepts_it_or_cannot_plan():
    logs: list[str] = []
    for answer in ({**REFUSED, "ok": True}, {"planning_error": "ValueError: x"}):
        check, seen = _checker(answer)
        argv = _argv("--max-num-batched-tokens", "256")
        assert align_mode_batch(argv, [], "0.21.0", TARGET, True, logs.append, check) == argv
        assert seen == [256]
    assert logs == ["warning: could not check the Mamba align-mode block size: ValueError: x"]
