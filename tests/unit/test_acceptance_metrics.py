"""The accept engine's reading of vLLM's speculative-decoding counters, with no GPU: acceptance
per position and acceptance length over the drafts made between two readings."""

from __future__ import annotations

from types import SimpleNamespace

from speculators_hybrid.accept.engine import acceptance, counts, end_ids, past_end


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


def test_the_share_of_tokens_after_the_end_of_the_reply() -> None:
    ends = {2, 7}
    # 3 of 4 after the end; none (no end); the end as the last token: none after it
    assert past_end([[5, 7, 1, 1, 1], [1, 1, 1], [1, 1, 2]], ends) == round(3 / 11, 4)
    assert past_end([[2, 2, 2]], ends) == round(2 / 3, 4)  # counted from the first end
    assert past_end([], ends) is None


def test_end_ids_are_eos_and_the_chat_end_of_turn() -> None:
    vocab = {"<|im_end|>": 9}
    tok = SimpleNamespace(
        eos_token_id=2, unk_token_id=0, convert_tokens_to_ids=lambda t: vocab.get(t, 0)
    )
    assert end_ids(tok) == {2, 9}
    vocab.clear()  # no chat end-of-turn: the unknown id is not an end
    assert end_ids(tok) == {2}
