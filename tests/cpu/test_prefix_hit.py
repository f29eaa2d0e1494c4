"""hidden-states-consistent-prefix-hit (vLLM 0.24-0.26): with vLLM's own scheduler, a prefix-cache
hit during hybrid extraction resumes where the GDN layers saved state, as without extraction.

The prompts are the GPU test's (tests/gpu/test_hidden_states_match.py): a 1,500-token prompt is
prefilled in steps of at most 512 tokens; a later prompt shares its first 1,200 tokens. Mamba
"align" mode saves the GDN state only where a step ends, so the later prompt may resume only
there. Prefix caching stays on for hybrid extraction on these releases.
"""

from __future__ import annotations

import random

import pytest
from conftest import engine_scheduler, host_answers, model_dir, model_output, needs
from upstream_worker import without

from speculators_hybrid import planning

pytestmark = needs("hidden-states-consistent-prefix-hit")

STEP_TOKENS = 512  # the GPU test's max_num_batched_tokens


def scheduler_for(ids: tuple[int, ...] | None):
    setup = planning.Setup(
        model=model_dir("tiny"), layer_ids=ids, prefix_caching=True, max_model_len=4096
    )
    config = planning.engine_config(setup)
    assert config.cache_config.enable_prefix_caching
    assert config.cache_config.mamba_cache_mode == "align"
    sched = config.scheduler_config
    sched.max_num_batched_tokens = sched.max_num_scheduled_tokens = STEP_TOKENS
    return engine_scheduler(config, planning.plan(config, planning.layer_specs(config), 2 << 30))


def run(scheduler, request, prompts: dict[str, list[int]]) -> dict[str, list[tuple[int, int]]]:
    """Every request to the end; the (start, end) token range of each of its steps."""
    for req_id, prompt in prompts.items():
        scheduler.add_request(request(req_id, prompt))
    steps: dict[str, list[tuple[int, int]]] = {r: [] for r in prompts}
    finished: set[str] = set()
    for _ in range(50):
        out = scheduler.schedule()
        for req_id, n in out.num_scheduled_tokens.items():
            end = scheduler.requests[req_id].num_computed_tokens
            steps[req_id].append((end - n, end))
        done = {r for r, s in steps.items() if s and s[-1][1] >= len(prompts[r])} - finished
        # The connector's "saved" for earlier finishers lets the scheduler free their blocks.
        saved = frozenset(r for r in finished if r in scheduler.requests)
        scheduler.update_from_output(out, model_output(out, dict.fromkeys(done, 7), saved))
        finished |= done
        if finished == set(prompts) and not scheduler.requests:
            break
    assert finished == set(prompts), steps
    return steps


def resume_points(ids: tuple[int, ...] | None) -> tuple[list[int], int]:
    """(where the 1,500-token prompt's steps ended, where the 1,277-token one started)."""
    rng = random.Random(0)
    first = [rng.randrange(1, 1020) for _ in range(1500)]
    later = first[:1200] + [rng.randrange(1, 1020) for _ in range(77)]
    scheduler, request = scheduler_for(ids)
    saved_at = [end for _, end in run(scheduler, request, {"first": first})["first"]]
    start = run(scheduler, request, {"later": later})["later"][0][0]
    return saved_at, start


@pytest.fixture
def caching_on(shim):
    yield  # on 0.24-0.26 nothing of ours turns prefix caching off (scheduler_for checks)


def test_without_extraction_the_hit_is_where_a_state_was_saved(caching_on):
    saved_at, start = resume_points(None)
    assert 0 < start < 1200 and start in saved_at, (saved_at, start)


def test_with_extraction_the_hit_is_the_same(caching_on):
    plain = resume_points(None)
    assert resume_points((1, 4, 5, 8)) == plain


def test_without_the_patch_extraction_resumes_where_no_state_was_saved(shim):
    with without("hidden-states-consistent-prefix-hit"):
        saved_at, start = resume_points((1, 4, 5, 8))
    assert start not in saved_at, (saved_at, start)  # the wrong hidden states seen on the GPU


def test_the_hit_is_the_same_on_every_host(caching_on):
    """On an AMX host vLLM 0.24's CPU platform turns prefix caching off (speculators_hybrid.cpu
    plans as a CUDA start does, so the host's CPU features change nothing)."""
    results = []
    for answer in (True, False):
        with host_answers(answer):
            results.append((resume_points(None), resume_points((1, 4, 5, 8))))
    assert results[0] == results[1]
    assert results[1][0] == results[1][1]
