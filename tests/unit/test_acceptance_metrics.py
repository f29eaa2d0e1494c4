"""The accept engine's reading of vLLM's speculative-decoding counters, with no GPU: acceptance
per position and acceptance length over the drafts made between two readings."""

from __future__ import annotations

from types import SimpleNamespace

from speculators_hybrid.accept.engine import acceptance, counts


def reading(drafts: float, accepted: float, per_pos: list[float]) -> list[SimpleNamespace]:
    """What `LLM.get_metrics()` returns for these counters (one engine), plus an unrelated one."""
    return [
        SimpleNamespace(name="vllm:spec_decode_num_drafts", value=drafts),
        SimpleNamespace(name="vllm:spec_decode_num_draft_tokens", value=drafts * len(per_pos)),
        SimpleNamespace(name="vllm:spec_decode_num_accepted_tokens", value=accepted),
        SimpleNamespace(name="vllm:spec_decode_num_accepted_tokens_per_pos", values=per_pos),
        SimpleNamespace(name="vllm:prompt_tokens", value=1234.0),
    ]


def test_acceptance_counts_only_the_drafts_after_the_warm_up() -> None:
    warm = counts(reading(10, 12, [7, 4, 1]))
    now = counts(reading(110, 142, [87, 44, 11]))
    got = acceptance(now, warm)
    assert got["num_drafts"] == 100 and got["num_accepted_tokens"] == 130
    assert got["acceptance_per_position"] == [0.8, 0.4, 0.1]
    assert got["acceptance_length"] == 2.3  # 1 + 130 / 100


def test_engines_add_up_and_no_drafts_means_no_acceptance() -> None:
    two = counts(reading(10, 5, [4, 1]) + reading(30, 15, [12, 3]))
    assert two["drafts"] == 40 and two["per_pos"] == [16, 4]
    none = counts([])
    got = acceptance(none, none)
    assert got["acceptance_per_position"] == [] and got["acceptance_length"] is None
