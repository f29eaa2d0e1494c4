"""1,000 requests through vLLM's real scheduler and the connector's scheduler side, on a KV pool
small enough to preempt (some requests generate on after their prompt), with aborts: every
finished request has exactly one complete save (its whole prompt, from the blocks it holds when
saved), a request aborted before its prompt was computed none, one aborted while generating
its one save of the prompt, and nothing stops the scheduler.

Ours (vLLM < 0.22; 0.22-0.23 with chunked prefill) and vLLM's own connector (>= 0.24, with our
patches). The model's forward is the stand-in (each step's output: a token for each request
whose prompt is done, and, for vLLM's connector, the saves it was handed in that step reported
done, as its worker does).
"""

from __future__ import annotations

import random
from collections import Counter

import pytest
from conftest import engine_config, engine_scheduler, model_output, needs, our_connector
from reliability_rig import chunked

from speculators_hybrid import planning
from speculators_hybrid.vllm_patches.connector import slots_for

pytestmark = pytest.mark.full_tier

N = 1000
CHUNK = 512
MEMORY = (
    24 << 20
)  # about 8,800 tokens of KV: generating requests fill it and the scheduler preempts


def lengths(rng: random.Random) -> list[int]:
    """Mixed: most short, some a chunk or more, a few several chunks (max_model_len 4096)."""
    out = []
    for _ in range(N):
        kind = rng.random()
        if kind < 0.6:
            out.append(rng.randint(1, 64))
        elif kind < 0.9:
            out.append(rng.randint(65, 700))
        else:
            out.append(rng.randint(701, 2500))
    return out


def hidden_gid(kv) -> int:
    """The hidden-state group: our spec (vLLM < 0.22) or vLLM's (>= 0.22)."""
    names = ("HiddenStatesCacheSpec", "HiddenStateCacheSpec")
    (gid,) = [
        i for i, g in enumerate(kv.kv_cache_groups) if type(g.kv_cache_spec).__name__ in names
    ]
    return gid


class Load:
    """Feeds requests, aborts some, steps the scheduler to the end; records what it saw."""

    def __init__(self, storage: str, upstream: bool):
        config = engine_config(  # chunked prefill on: ours on 0.22-0.23 (chunked_prompts.py)
            preset="tiny",
            ids=(2, 5, 8),
            prefix_caching=False,
            max_model_len=4096,
            chunked_prefill=None,
        )
        config.kv_transfer_config.kv_connector_extra_config["shared_storage_path"] = storage
        chunked(config, CHUNK)
        self.kv = planning.plan(config, planning.layer_specs(config), MEMORY)
        self.scheduler, self.request = engine_scheduler(config, self.kv)
        self.gid = hidden_gid(self.kv)
        self.block = self.kv.kv_cache_groups[self.gid].kv_cache_spec.block_size
        self.upstream = upstream
        rng = random.Random(20)
        self.prompts = {
            f"cmpl-{i:04d}-0": [rng.randint(1, 30000) for _ in range(n)]
            for i, n in enumerate(lengths(rng))
        }
        ids = list(self.prompts)
        # 1 in 10 aborted, at a step from "still waiting" to "a few steps in".
        self.abort_at = {r: rng.randint(0, 40) for r in rng.sample(ids, N // 10)}
        self.arrive = {r: i // 50 for i, r in enumerate(ids)}  # 50 new requests a step
        # Most extraction requests ask for 1 token; some generate on (they grow in the pool and
        # make the scheduler preempt, before or after their prompt was saved).
        self.max_tokens = {r: 1 if rng.random() < 0.7 else rng.randint(20, 150) for r in ids}
        self.saves: Counter[str] = Counter()
        self.finished: dict[str, dict] = {}
        self.aborted: set[str] = set()
        self.cut: set[str] = set()  # aborted before their prompt was computed
        self.preempted: set[str] = set()
        self.added: dict[str, int] = {}
        self.bad: list[str] = []

    def run(self, max_steps: int = 5000) -> None:
        from vllm.v1.request import RequestStatus

        pending = list(self.prompts)
        report: set[str] = set()  # vLLM's connector: saves handed out last step, now done
        for step in range(max_steps):
            while pending and self.arrive[pending[0]] <= step:
                r = pending.pop(0)
                req = self.request(r, self.prompts[r])
                req.sampling_params.max_tokens = req.max_tokens = self.max_tokens[r]
                self.scheduler.add_request(req)
                self.added[r] = step
            due = [
                r
                for r, at in self.abort_at.items()
                if r in self.added
                and self.added[r] + at <= step
                and r not in self.finished
                and r not in self.aborted
            ]
            if due:
                for r in due:  # its prompt computed when the client hung up?
                    req = self.scheduler.requests[r]
                    if req.num_computed_tokens < req.num_prompt_tokens:
                        self.cut.add(r)
                self.scheduler.finish_requests(due, RequestStatus.FINISHED_ABORTED)
                self.aborted.update(due)
            out = self.scheduler.schedule()
            report = self.check_saves(out) if self.upstream else self.check_ours(out)
            for r in self.scheduler.requests.values():
                if r.status == RequestStatus.PREEMPTED:
                    self.preempted.add(r.request_id)
            done = {
                r
                for r in out.num_scheduled_tokens
                if self.scheduler.requests[r].num_computed_tokens
                >= self.scheduler.requests[r].num_prompt_tokens
            }
            results = self.scheduler.update_from_output(
                out, model_output(out, {r: 7 for r in done}, frozenset(report))
            )
            for eco in results.values():
                for o in eco.outputs:
                    if o.finished:
                        assert o.request_id not in self.finished, o.request_id
                        self.finished[o.request_id] = o.kv_transfer_params
            if not pending and not self.scheduler.has_requests() and not report:
                return
        raise AssertionError(f"not done after {max_steps} steps")

    def check_ours(self, out) -> set[str]:
        for save in out.kv_connector_metadata.saves:
            self.saves[save.req_id] += 1
            prompt = self.prompts[save.req_id]
            blocks = self.scheduler.kv_cache_manager.get_block_ids(save.req_id)[self.gid]
            expected = slots_for(list(blocks), self.block, len(prompt))
            if save.token_ids != prompt or save.slots.tolist() != expected.tolist():
                self.bad.append(save.req_id)
        return set()

    def check_saves(self, out) -> set[str]:
        """vLLM >= 0.24: a finished request's save travels in the next step's metadata."""
        meta = out.kv_connector_metadata
        handed = set()
        for save in getattr(meta, "pending_saves", []):
            self.saves[save.req_id] += 1
            prompt = self.prompts[save.req_id]
            covered = len(save.block_ids) * self.block
            if save.token_ids.tolist() != prompt or covered < len(prompt):
                self.bad.append(save.req_id)
            handed.add(save.req_id)
        return handed

    def verdict(self) -> None:
        finished = set(self.finished) - self.aborted
        assert len(self.preempted) >= 5, f"only {len(self.preempted)} preemptions"
        assert len(self.aborted) >= N // 20
        assert finished | self.aborted == set(self.prompts)
        assert self.bad == []
        assert {r for r in finished if self.saves[r] != 1} == set()  # exactly one save each
        assert len(self.cut) >= N // 20
        assert {r for r in self.cut if self.saves[r]} == set()  # aborted mid-prompt: none
        # Aborted while generating, after the prompt: its whole prompt was saved, once.
        assert {r for r in self.aborted - self.cut if self.saves[r] != 1} == set()
        for r in finished:
            path = self.finished[r]["hidden_states_path"]
            assert path.endswith(f"/{r}.safetensors"), (r, path)


@pytest.mark.shim_only  # our connector class
@our_connector()
def test_our_connector_under_load(shim, tmp_path):
    load = Load(str(tmp_path), upstream=False)
    load.run()
    load.verdict()


# vLLM 0.22-0.23's saves in the forward pass and refuses chunked prefill (there: ours, above).
@needs("hidden-states-safe-file-names", "hidden-states-whole-prompts-only")
def test_vllms_connector_under_load(shim, tmp_path):
    load = Load(str(tmp_path), upstream=True)
    load.run()
    load.verdict()
