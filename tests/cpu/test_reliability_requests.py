"""Requests the extraction contract does not expect, and aborts, through vLLM's own code.

max_tokens > 1: one file of the prompt only. n > 1: vLLM's frontend fans the request out into
children `{i}_{id}` (its ParentRequest); each child is an ordinary request with a file of its
own. An empty prompt, or one of max_model_len tokens or more: refused by vLLM's input
processor before the engine sees it (its `_validate_prompt_len`, as vLLM's frontend calls it).
Aborts: a request aborted before its prompt is computed gets no file; one aborted while
generating keeps its one whole file; nothing stops the scheduler (vLLM 0.24-0.30 stopped on a
request aborted while waiting: `hidden-states-whole-prompts-only`).
"""

from __future__ import annotations

import types

import pytest
import torch
from conftest import engine_config, engine_scheduler, model_output, needs, our_connector
from reliability_rig import chunked
from safetensors.torch import load_file

from speculators_hybrid import planning

OURS = [pytest.mark.shim_only, our_connector()]
CHUNK = 512


def ours(tmp_path, **extra):
    from reliability_rig import rig

    return rig(str(tmp_path), chunk=CHUNK, async_writes=False, **extra)


def generating(made, req_id: str, prompt: list[int], max_tokens: int):
    """A request of vLLM's own making that asks for `max_tokens` tokens."""
    req = made.request(req_id, prompt)
    req.sampling_params.max_tokens = req.max_tokens = max_tokens
    return req


def steps_until_done(made, req_id: str) -> tuple[int, dict, list]:
    """Step (worker and scheduler) until `req_id` finishes: steps, its params, its saves."""
    saves = []
    for step in range(1, 200):
        out = made.scheduler.schedule()
        saves += [s for s in out.kv_connector_metadata.saves if s.req_id == req_id]
        sampled = {
            r: 7
            for r in out.num_scheduled_tokens
            if made.scheduler.requests[r].num_computed_tokens
            >= made.scheduler.requests[r].num_prompt_tokens
        }
        finished = made.finish(out, sampled)
        if req_id in finished:
            return step, finished[req_id], saves
    raise AssertionError("did not finish")


@OURS[0]
@OURS[1]
def test_max_tokens_above_one_gives_one_file_of_the_prompt(shim, tmp_path):
    made = ours(tmp_path)
    prompt = list(range(1, 41))
    made.scheduler.add_request(generating(made, "gen", prompt, 6))
    steps, params, saves = steps_until_done(made, "gen")
    assert steps == 6 and len(saves) == 1  # saved once, when the prompt was done
    data = load_file(params["hidden_states_path"])
    assert data["token_ids"].tolist() == prompt  # the prompt, not the generated tokens
    assert torch.equal(
        data["hidden_states"], made.cache[saves[0].slots // made.block, saves[0].slots % made.block]
    )


@OURS[0]
@OURS[1]
def test_n_above_one_gives_each_child_its_own_file(shim, tmp_path):
    from vllm import SamplingParams
    from vllm.v1.engine.parallel_sampling import ParentRequest

    made = ours(tmp_path)
    params = SamplingParams(n=3, max_tokens=1)
    # What vLLM's frontend holds for the parent (an EngineCoreRequest's fields it reads).
    parent = ParentRequest(
        types.SimpleNamespace(request_id="cmpl-abc-0", external_req_id="cmpl-abc", params=params)
    )
    prompt = list(range(5, 35))
    paths = []
    for i in range(parent.n):
        child_id, child_params = parent.get_child_info(i)
        assert child_params.n == 1
        paths.append(made.run(child_id, prompt)["hidden_states_path"])
    assert [p.rsplit("/", 1)[1] for p in paths] == [f"{i}_cmpl-abc-0.safetensors" for i in range(3)]
    for path in paths:
        assert load_file(path)["token_ids"].tolist() == prompt


def _input_processor(config):
    """vLLM's InputProcessor as __init__ leaves it for a text-only model (the fields
    `_validate_prompt_len` reads), without a tokenizer or renderer."""
    from vllm.v1.engine.input_processor import InputProcessor

    made = InputProcessor.__new__(InputProcessor)
    made.model_config = config.model_config
    made.supports_mm_inputs = False
    made.mm_encoder_cache_size = 0
    made.skip_prompt_length_check = False
    return made


def test_an_empty_or_too_long_prompt_is_refused_before_the_engine(shim):
    try:  # vLLM >= 0.30's own error class (a client error, not a ValueError)
        from vllm.exceptions import VLLMValidationError
    except ImportError:
        VLLMValidationError = ValueError  # noqa: N806
    config = engine_config(preset="tiny", ids=(2, 5, 8), prefix_caching=False, max_model_len=4096)
    check = _input_processor(config)
    refused = (ValueError, VLLMValidationError)
    with pytest.raises(refused, match="prompt cannot be empty"):
        check._validate_prompt_len(0, "decoder")
    with pytest.raises(refused, match="longer than the maximum model length"):
        check._validate_prompt_len(4097, "decoder")
    with pytest.raises(refused, match="requested output tokens"):
        check._validate_prompt_len(4096, "decoder")  # no room for the one output token
    check._validate_prompt_len(4095, "decoder")  # the longest accepted prompt


@OURS[0]
@OURS[1]
def test_the_longest_accepted_prompt_gives_one_whole_file(shim, tmp_path):
    made = ours(tmp_path)
    prompt = [1 + i % 30000 for i in range(4095)]  # max_model_len - 1, in 8 chunks
    made.scheduler.add_request(made.request("longest", prompt))
    steps, params, saves = steps_until_done(made, "longest")
    assert steps >= 8 and len(saves) == 1
    assert load_file(params["hidden_states_path"])["token_ids"].tolist() == prompt


# ---- aborts ----


def _abort(scheduler, *req_ids: str) -> None:
    from vllm.v1.request import RequestStatus

    scheduler.finish_requests(list(req_ids), RequestStatus.FINISHED_ABORTED)


@OURS[0]
@OURS[1]
def test_our_connector_saves_no_file_for_an_aborted_prompt(shim, tmp_path):
    made = ours(tmp_path)
    made.scheduler.add_request(made.request("waiting", list(range(1, 30))))
    _abort(made.scheduler, "waiting")  # before it was ever scheduled
    made.scheduler.add_request(made.request("cut", list(range(1, 1500))))
    out = made.scheduler.schedule()  # its first chunk
    assert not out.kv_connector_metadata.saves
    made.finish(out, {})
    _abort(made.scheduler, "cut")
    made.scheduler.add_request(generating(made, "talking", list(range(1, 30)), 8))
    saves = []
    for _ in range(3):
        out = made.scheduler.schedule()
        saves += out.kv_connector_metadata.saves
        made.finish(out, {"talking": 7})
    _abort(made.scheduler, "talking")  # generating: its prompt was saved, whole
    assert [s.req_id for s in saves] == ["talking"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "talking.safetensors",
        "talking.safetensors.lock",
    ]


def _plan(tmp_path):
    """Config and plan (engine_config re-arms every patch: build them before `without`)."""
    config = engine_config(preset="tiny", ids=(2, 5, 8), prefix_caching=False, max_model_len=4096)
    config.kv_transfer_config.kv_connector_extra_config["shared_storage_path"] = str(tmp_path)
    chunked(config, CHUNK)
    return config, planning.plan(config, planning.layer_specs(config), 64 << 20)


def _aborts(scheduler, request) -> dict[str, list]:
    """Three aborts: while waiting, mid-prompt, while generating. The saves vLLM's connector
    hands its worker in the steps after, by request id (reported done, as its worker does)."""
    saves: dict[str, list] = {}

    def step(sampled: dict[str, int]) -> None:
        out = scheduler.schedule()
        for save in out.kv_connector_metadata.pending_saves:
            saves.setdefault(save.req_id, []).append(save)
        done = frozenset(s.req_id for s in out.kv_connector_metadata.pending_saves)
        scheduler.update_from_output(out, model_output(out, sampled, done))

    scheduler.add_request(request("waiting", list(range(1, 30))))
    _abort(scheduler, "waiting")
    scheduler.add_request(request("cut", list(range(1, 1500))))
    step({})
    assert 0 < scheduler.requests["cut"].num_computed_tokens < 1499  # mid-prompt
    _abort(scheduler, "cut")
    talking = request("talking", list(range(1, 30)))
    talking.sampling_params.max_tokens = talking.max_tokens = 8
    scheduler.add_request(talking)
    for _ in range(3):
        step({"talking": 7})
    _abort(scheduler, "talking")
    step({})
    return saves


@needs("hidden-states-whole-prompts-only")
def test_aborted_requests_write_no_file(shim, tmp_path):
    scheduler, request = engine_scheduler(*_plan(tmp_path))
    saves = _aborts(scheduler, request)
    assert list(saves) == ["talking"]  # only the request whose prompt was computed
    (save,) = saves["talking"]
    assert save.token_ids.tolist() == list(range(1, 30))


@needs("hidden-states-whole-prompts-only")
def test_without_the_patch_aborts_stop_the_engine_or_save_garbage(shim, tmp_path):
    from upstream_worker import VLLM, without

    config, kv = _plan(tmp_path)
    with without("hidden-states-whole-prompts-only"):
        scheduler, request = engine_scheduler(config, kv)
        if VLLM.release < (0, 31):
            scheduler.add_request(request("waiting", list(range(1, 30))))
            with pytest.raises(KeyError):  # out of the scheduler: the engine core stops
                _abort(scheduler, "waiting")
            return
        saves = _aborts(scheduler, request)
        # The request cut after 512 of its 1,499 tokens is saved as if whole.
        assert sorted(saves) == ["cut", "talking"]
