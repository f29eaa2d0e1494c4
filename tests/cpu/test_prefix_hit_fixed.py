"""From vLLM 0.27.0 a prefix-cache hit during hybrid extraction resumes where the GDN layers
saved state without our patch: the scheduler reconciles a per-group hit that no connector backs
(issue 46453), so hidden-states-consistent-prefix-hit is retired there. The prompts and steps of
test_prefix_hit.py, with vLLM's own scheduler and prefix caching on, and a third prompt: from
0.29 vLLM keeps no GDN state in the middle of a prompt by default, only where a prompt ends or a
shared prefix was seen, so there the second prompt misses and the third one hits.
"""

from __future__ import annotations

import random

import pytest
from conftest import PATCHER, VLLM, vllm_patches
from packaging.version import Version
from test_prefix_hit import caching_on, run, scheduler_for  # noqa: F401 (caching_on: a fixture)

pytestmark = pytest.mark.skipif(
    VLLM < Version("0.27"),
    reason="upstream reconciles the hit from vLLM 0.27.0 (before: test_prefix_hit.py)",
)


def resumes(ids: tuple[int, ...] | None) -> list[tuple[int, set[int]]]:
    """For the 2nd and 3rd prompt: (where it started, where every earlier step had ended)."""
    rng = random.Random(0)
    first = [rng.randrange(1, 1020) for _ in range(1500)]
    prompts = {
        "first": first,
        "later": first[:1200] + [rng.randrange(1, 1020) for _ in range(77)],
        "third": first[:1200] + [rng.randrange(1, 1020) for _ in range(90)],
    }
    scheduler, request = scheduler_for(ids)
    ended: set[int] = set()
    out = []
    for name, prompt in prompts.items():
        steps = run(scheduler, request, {name: prompt})[name]
        if name != "first":
            out.append((steps[0][0], set(ended)))
        ended |= {end for _, end in steps}
    return out


def test_stock_extraction_resumes_where_a_state_was_saved(caching_on):  # noqa: F811
    selected = {p.id for p in PATCHER.select(vllm_patches())}
    assert "hidden-states-consistent-prefix-hit" not in selected
    # Each run on its own: where the plain run resumes has differed between hosts (0.27.1 on
    # CI: 880 once, 960 here), so extraction is held to the rule, not to that run's numbers.
    for ids in (None, (1, 4, 5, 8)):
        runs = resumes(ids)
        assert any(start for start, _ in runs), (ids, runs)  # some prompt hits the cache
        for start, ended in runs:
            assert start == 0 or start in ended, (ids, start, sorted(ended))
