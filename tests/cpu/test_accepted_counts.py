"""no-accepted-count-wait-in-prefill: vLLM's own accepted-count update of the GPU model runner
(`GPUModelRunner._update_states_after_model_execute`, vLLM 0.20-0.23), run on the CPU on a
runner holding what that method reads: vLLM's CpuGpuBuffer for the counts, the input batch's
host counts, and an event that records whether the copy was queued (the next step's input
preparation waits on it); and vLLM's own scheduler, as a GPU engine core runs it, showing that
no step of an extraction schedules a draft token (so every step takes the skip).
"""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace

import pytest
import torch
from conftest import engine_config, engine_scheduler, model_output, needs, set_shim

from speculators_hybrid import planning

pytestmark = needs("no-accepted-count-wait-in-prefill")


class Event:
    """Stands in for the CUDA event: counts the copies the next step would wait for."""

    def __init__(self) -> None:
        self.recorded = 0

    def record(self) -> None:
        self.recorded += 1


def runner(held: list[int], mode: str = "none") -> SimpleNamespace:
    from vllm.v1.utils import CpuGpuBuffer

    counts = torch.tensor(held + [1] * (8 - len(held)), dtype=torch.int32)
    return SimpleNamespace(
        speculative_config=object(),
        model_config=SimpleNamespace(is_hybrid=True),
        cache_config=SimpleNamespace(mamba_cache_mode=mode),
        num_accepted_tokens=CpuGpuBuffer(
            8, dtype=torch.int64, device=torch.device("cpu"), pin_memory=False
        ),
        input_batch=SimpleNamespace(
            num_accepted_tokens_cpu_tensor=counts, num_accepted_tokens_cpu=counts.numpy()
        ),
        num_accepted_tokens_event=Event(),
    )


def update(state: SimpleNamespace, tokens: list[list[int]], drafts: dict) -> None:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    output = SimpleNamespace(scheduled_spec_decode_tokens=drafts)
    method = GPUModelRunner.__dict__["_update_states_after_model_execute"]
    method.__get__(state, GPUModelRunner)(torch.tensor(tokens), output)  # as `self.` calls it


PREFILL = [[11], [12], [13]]  # one sampled token per request, no draft scheduled
DECODE = [[11, 21], [12, -1], [13, 23]]  # one draft each: accepted, rejected, accepted
DRAFTS = {"a": [20], "b": [30], "c": [40]}


@pytest.mark.parametrize("on", [True, False], ids=["shim", "stock"])
def test_a_prefill_step_queues_no_copy_and_leaves_the_counts_as_vllm_would(on):
    """Stock vLLM queues the copy (the next step waits for this one); with the shim nothing is
    queued, and the host counts are what vLLM's copy would have written: 1 for every request."""
    set_shim(on)
    try:
        state = runner([1, 1, 1])
        update(state, PREFILL, {})
    finally:
        set_shim(True)
    assert state.num_accepted_tokens_event.recorded == (0 if on else 1)
    assert state.input_batch.num_accepted_tokens_cpu[:3].tolist() == [1, 1, 1]


def test_a_decode_step_runs_vllms_update(shim):
    state = runner([1, 1, 1])
    update(state, DECODE, DRAFTS)
    assert state.num_accepted_tokens_event.recorded == 1
    assert state.input_batch.num_accepted_tokens_cpu[:3].tolist() == [2, 1, 2]


def test_a_prefill_step_after_a_decode_still_writes_its_ones(shim):
    """A request still holding 2 from its last decode step gets vLLM's update (1 again)."""
    state = runner([2, 1, 1])
    update(state, PREFILL, {})
    assert state.num_accepted_tokens_event.recorded == 1
    assert state.input_batch.num_accepted_tokens_cpu[:3].tolist() == [1, 1, 1]


def test_prefix_caching_state_copies_are_left_to_vllm():
    from speculators_hybrid.vllm_patches.accepted_counts import changes_nothing

    batch = SimpleNamespace(scheduled_spec_decode_tokens={})
    for mode, skipped in (("none", True), ("align", False), ("all", False)):
        assert changes_nothing(runner([1, 1, 1], mode), torch.tensor(PREFILL), batch) is skipped


def test_no_step_of_an_extraction_schedules_a_draft_token(shim):
    """vLLM's own scheduler as the engine core runs it on a GPU (AsyncScheduler: async
    scheduling is on there, two steps in flight), through prompts that span steps and chunks:
    no step schedules a draft token, so every step of an extraction takes the skip."""
    config = engine_config(max_model_len=8192)
    config.scheduler_config.async_scheduling = True  # the CPU platform turns it off
    kv = planning.plan(config, planning.layer_specs(config), 8 << 30)
    scheduler, request = engine_scheduler(config, kv)
    assert type(scheduler).__name__ == "AsyncScheduler"
    chunk = config.scheduler_config.max_num_batched_tokens
    most = 8000  # within max_model_len (and the chunk where chunked prefill is off: 0.22-0.23)
    lengths = [min(chunk + 900, most), 7, 300, chunk // 2, min(3 * chunk // 2, most), most, 1, 64]
    for i, n in enumerate(lengths):
        scheduler.add_request(request(f"r{i}", list(range(1, n + 1))))
    in_flight: deque = deque()
    finished, saved, steps = set(), frozenset(), 0
    while scheduler.has_requests():
        steps += 1
        assert steps < 200, "the requests did not finish"
        out = scheduler.schedule()
        assert not out.scheduled_spec_decode_tokens
        in_flight.append((out, dict.fromkeys(planning.prompts_done(scheduler, out), 7)))
        while len(in_flight) == 2 or (in_flight and not out.total_num_scheduled_tokens):
            step, sampled = in_flight.popleft()
            # vLLM >= 0.22's connector holds a finished request's blocks until its save is done
            results = scheduler.update_from_output(step, model_output(step, sampled, saved))
            finished |= {o.request_id for e in results.values() for o in e.outputs if o.finished}
            saved = frozenset(r for r in sampled if r in scheduler.requests)
    assert finished == {f"r{i}" for i in range(len(lengths))}
