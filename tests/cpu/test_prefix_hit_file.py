"""Issue 17: with prefix caching on for hybrid extraction (vLLM 0.22-0.33, kept on by the
plugin), the file the connector writes after a prefix-cache hit
holds every prompt token, each row read from the slot where that token's row was written, and
equals the file of an uncached run of the same prompt. The connector is vLLM's own from 0.24;
on 0.22-0.23, where vLLM's connector refuses chunked prefill (which a hybrid model's caching
needs), ours, named by hidden-states-chunked-prompts.

Real: the config (every patch this vLLM needs), the KV-cache plan,
vLLM's scheduler with its KV cache manager and prefix cache, the scheduler-side connector it
makes (`build_connector_meta`, `request_finished`), the worker-side connector (vLLM's factory,
its save and write), the proposer's store (`basic_cache`) and vLLM's reader. The model is what
stands in: a worker step writes, for each token the scheduler scheduled, a row that is a
function of (position, token id, the whole prefix up to it) (a causal model's hidden state
depends on nothing else) into the slot the request's hidden-group block table gives that
position, as the model runner's slot mapping does; tokens the scheduler did not schedule (a
hit) are not written.

The prompts: a 1,500-token one, prefilled in steps of at most 512 tokens, then two prompts that
share its first L tokens: below one block, one block, six blocks (where a step ended), eight
blocks (across a step's end), 1,200 tokens (the GPU test's, across two), 1,010 tokens (across
two, no block's multiple) and the whole prompt again. Two, since from 0.29 vLLM keeps the GDN
state of a shared prefix only once it has seen it (test_prefix_hit_fixed.py): the second prompt
may miss where the third hits. Each hit must also resume where a step ended (where the GDN layers
saved state): without hidden-states-consistent-prefix-hit, 0.24-0.26 fail that (eight blocks:
resumed at 640), while the rows still match, since the stand-in model has no GDN state; that
part is test_prefix_hit.py's.

vLLM issue 44485 (the file after a hit holds only the newly computed tokens, 0.22.0) is the
0.22-0.23 connector's read in the forward pass, with that step's slot mapping; from 0.24 the
connector reads the request's whole hidden-group block table at `request_finished`, and this
test shows that table covers the cached tokens too. On 0.22-0.23 a hybrid model never reaches
that read with a hit: without chunked prefill vLLM cannot cache its prefixes, and with it that
connector is refused at start-up (test_chunked_prompts.py); ours reads the whole block table in
the step that completes the prompt.
"""

from __future__ import annotations

import copy
import hashlib
import random
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import pytest
import torch
from conftest import PATCHED_VLLM, PATCHER, model_dir, model_output
from reliability_rig import chunked
from upstream_worker import (  # noqa: F401 (cpu_copies: a fixture)
    VLLM,
    cpu_copies,
    extraction,
    hidden_group,
    load,
    runner_views,
    storage,
    without,
)

from speculators_hybrid import planning
from speculators_hybrid.vllm_patches.connector import slots_for
from speculators_hybrid.vllm_patches.hma_config import CONNECTOR, STOCK_CONNECTOR
from speculators_hybrid.vllm_patches.prefix_caching import STOCK_REFUSES_CHUNKED, STOCK_TAKES_CHUNKS

pytestmark = [
    pytest.mark.full_tier,  # several engines' worth of scheduling per case: the full releases
    pytest.mark.usefixtures("cpu_copies"),
    pytest.mark.shim_only,  # with the plugin (on 0.22-0.23 its connector takes the chunks)
    pytest.mark.skipif(
        VLLM < STOCK_REFUSES_CHUNKED[0], reason="vLLM < 0.22: the plugin's own connector path"
    ),
]

IDS = (1, 4, 5, 8)
HIDDEN = 256  # the tiny preset's hidden size
STEP = 512  # the GPU test's max_num_batched_tokens
V1_VIEWS = VLLM.release < (0, 29)  # the V1 model runner's page-padded views
# 0.22-0.23: our connector writes (chunked_prompts.py), or vLLM's as patches/vllm changes it
OURS = VLLM < STOCK_TAKES_CHUNKS and not PATCHED_VLLM
_RNG = random.Random(0)
FIRST = [_RNG.randrange(1, 1020) for _ in range(1500)]


@cache
def _config(shim_patches: tuple[str, ...], caching: bool) -> Any:
    setup = planning.Setup(
        model=model_dir("tiny"), layer_ids=IDS, prefix_caching=caching, max_model_len=4096
    )
    return planning.engine_config(setup)


def config_for(tmp_path, caching: bool = True) -> Any:
    config = copy.deepcopy(_config(tuple(p.id for p in PATCHER.selected), caching))
    if caching:
        assert config.cache_config.enable_prefix_caching  # kept on
        assert config.cache_config.mamba_cache_mode == "align"
    assert config.kv_transfer_config.kv_connector == (CONNECTOR if OURS else STOCK_CONNECTOR)
    chunked(config, STEP)
    storage(config, tmp_path)
    return config


def prefix_keys(prompt: list[int]) -> list[bytes]:
    """A digest of (position, token id, every token before it) for each position."""
    keys, digest = [], b""
    for pos, token in enumerate(prompt):
        digest = hashlib.blake2b(
            digest + pos.to_bytes(4, "little") + token.to_bytes(4, "little"), digest_size=28
        ).digest()
        keys.append(digest)
    return keys


def rows(prompt: list[int]) -> torch.Tensor:
    """The stand-in model's hidden states: [tokens, ids, hidden], exact in bfloat16 (integers
    0-255: position and token id, then the prefix digest, shifted per id)."""
    head = [[p >> 8, p & 255, t >> 8, t & 255] for p, t in enumerate(prompt)]
    body = torch.tensor(
        [h + list(k) for h, k in zip(head, prefix_keys(prompt), strict=True)]
    )  # [n, 32]
    per_id = torch.stack([(body + 37 * i) % 256 for i in range(len(IDS))], dim=1)
    return per_id.repeat(1, 1, HIDDEN // body.shape[1]).to(torch.bfloat16)


@dataclass
class Run:
    prompt: list[int]
    hit: int = -1  # tokens computed when first scheduled (the prefix-cache hit)
    steps: list[tuple[int, int]] = field(default_factory=list)
    read_blocks: list[int] = field(default_factory=list)  # the blocks the save reads
    read_tokens: list[int] = field(default_factory=list)  # the save's token ids
    read_keys: list[bytes | None] = field(default_factory=list)  # the rows in the slots read
    file: dict[str, torch.Tensor] = field(default_factory=dict)


class Engine:
    """vLLM's scheduler and connectors for one plan, and the stand-in model's writes."""

    def __init__(self, ex: Any) -> None:
        self.ex = ex
        self.written: dict[int, bytes] = {}  # slot -> key of the row last written there

    def run(self, req_id: str, prompt: list[int]) -> Run:
        from vllm.model_executor.models.extract_hidden_states import (
            CacheOnlyAttentionMetadata,
            basic_cache,
        )

        ex, sched = self.ex, self.ex.scheduler
        run, table, states, keys = Run(prompt), [], rows(prompt), prefix_keys(prompt)
        sched.add_request(ex.request(req_id, prompt))
        params = None
        for _ in range(30):
            out = sched.schedule()
            for new in out.scheduled_new_reqs:
                assert new.req_id == req_id
                table, run.hit = list(new.block_ids[ex.gid]), new.num_computed_tokens
            cached = out.scheduled_cached_reqs
            assert not getattr(cached, "resumed_req_ids", ())  # no preemption (0.34: no field)
            for r, ids in zip(cached.req_ids, cached.new_block_ids, strict=True):
                assert r == req_id
                table += list(ids[ex.gid]) if ids else []
            n = out.num_scheduled_tokens.get(req_id, 0)
            done: set[str] = set()
            meta = out.kv_connector_metadata
            ex.worker.bind_connector_metadata(meta)
            if n:  # the forward: each scheduled token's row into its slot
                end = sched.requests[req_id].num_computed_tokens
                run.steps.append((end - n, end))
                slots = slots_for(table, ex.block, end)[end - n :]
                basic_cache(states[end - n : end], ex.view, slots)
                self.written.update(zip(slots.tolist(), keys[end - n : end], strict=True))
                done = {req_id} if end >= len(prompt) else set()
            # Read in the forward, after its writes: ours (`saves`), or vLLM 0.22-0.23's as
            # patches/vllm changes it (`requests`, each with the prompt's slots).
            in_forward = getattr(meta, "saves", None) or getattr(meta, "requests", None) or ()
            for save in in_forward:
                assert save.req_id == req_id
                read = getattr(save, "slots", None)
                read = (save.slot_mapping if read is None else read).tolist()
                run.read_tokens = [int(t) for t in save.token_ids]
                run.read_blocks = sorted({s // ex.block for s in read})
                run.read_keys = [self.written.get(s) for s in read]
            if in_forward:
                ex.worker.save_kv_layer(ex.layer, ex.view, CacheOnlyAttentionMetadata(slots))
            for save in getattr(meta, "pending_saves", ()):  # vLLM's, from 0.24
                assert save.req_id == req_id
                run.read_blocks, run.read_tokens = list(save.block_ids), save.token_ids.tolist()
                # What the slots hold when the worker reads them (in this step's get_finished)
                read = slots_for(run.read_blocks, ex.block, len(prompt)).tolist()
                run.read_keys = [self.written.get(s) for s in read]
            ex.worker.wait_for_save()
            sending, _ = ex.worker.get_finished(out.finished_req_ids)
            ex.worker.clear_connector_metadata()
            results = sched.update_from_output(
                out, model_output(out, dict.fromkeys(done, 7), frozenset(sending or ()))
            )
            for eco in results.values():
                for o in eco.outputs:
                    if o.finished:
                        params = o.kv_transfer_params
            if params is not None and req_id not in sched.requests:  # saved, blocks freed
                run.file = load(params["hidden_states_path"])
                return run
        raise AssertionError(f"{req_id!r} did not finish: {run}")


def engine(tmp_path, caching: bool = True):
    config = config_for(tmp_path, caching)
    kv = planning.plan(config, planning.layer_specs(config), 64 << 20)
    view = None
    if V1_VIEWS:  # the runner's own views: the hidden layer's pages shared with other groups'
        _, views = runner_views(config, kv)
        view = views[hidden_group(kv)[1].layer_names[0]]
    return extraction(config, kv, view)


def prompts(shared: int) -> dict[str, list[int]]:
    rng = random.Random(shared)
    if shared >= len(FIRST):
        return {"first": FIRST, "second": FIRST, "third": FIRST}
    return {
        "first": FIRST,
        "second": FIRST[:shared] + [rng.randrange(1, 1020) for _ in range(77)],
        "third": FIRST[:shared] + [rng.randrange(1, 1020) for _ in range(90)],
    }


def uncached(tmp_path, name: str, prompt: list[int]) -> Run:
    """The same prompt alone, through a fresh engine (an empty prefix cache)."""
    folder = tmp_path / f"uncached-{name}"
    folder.mkdir()
    with engine(folder) as ex:
        run = Engine(ex).run(name, prompt)
    assert run.hit == 0
    return run


SHARED = {  # L in units of the engine block (80 tokens here), or tokens
    "below-a-block": lambda b: b // 2 + 3,
    "one-block": lambda b: b,
    "six-blocks": lambda b: 6 * b,  # 480: where the first step ended
    "eight-blocks": lambda b: 8 * b,  # across the first step's end
    "across-two-steps": lambda b: 1200,  # the GPU test's: 15 blocks, two steps' ends
    "no-block-multiple": lambda b: 1010,  # across two steps' ends, no block's multiple
    "whole-prompt": lambda b: len(FIRST),
}


# Our patches that wrap vLLM's connector (file names, no save for unfinished prompts, file
# metadata): left out, the file is vLLM's connector's own. (0.24.0 keeps hidden-states-read-slots:
# without it every row reads zero, prefix hit or not; test_hidden_read.py.)
CONNECTOR_PATCHES = (
    "hidden-states-safe-file-names",
    "hidden-states-whole-prompts-only",
    "hidden-states-provenance",
)


def check(tmp_path, case: str) -> list[int]:
    """Every check of a case; the hits of the 2nd and 3rd prompt."""
    with engine(tmp_path) as ex:
        block = ex.scheduler.block_size
        shared = SHARED[case](block)
        eng = Engine(ex)
        runs = {name: eng.run(name, p) for name, p in prompts(shared).items()}
    ended = {end for run in runs.values() for _, end in run.steps}
    hits = [runs["second"].hit, runs["third"].hit]
    print(f"vLLM {VLLM} {case}: L={shared} hits {hits}")
    for name, run in runs.items():
        prompt = run.prompt
        # The scheduler-side connector's save: every prompt token, from blocks covering them.
        assert run.read_tokens == prompt
        assert len(run.read_blocks) * ex.block >= len(prompt)
        # Each slot read holds the row of that position of this very prefix.
        assert run.read_keys == prefix_keys(prompt), name
        # The file: every token, and the rows an uncached run of the same prompt gives.
        assert run.file["token_ids"].tolist() == prompt
        assert run.file["hidden_states"].shape[0] == len(prompt)
        assert torch.equal(run.file["hidden_states"], rows(prompt)), name
        if name != "first":
            # On whole hidden blocks (0.32+ hit on the hash block, here the hidden group's 20
            # tokens, not the engine's 80), where a step ended: GDN state exists there
            # (test_prefix_hit*.py).
            assert run.hit <= shared and run.hit % ex.block == 0, (name, run.hit)
            assert run.hit == 0 or run.hit in ended, (name, run.hit, sorted(ended))
            alone = uncached(tmp_path, name, prompt)
            assert torch.equal(run.file["hidden_states"], alone.file["hidden_states"]), name
            assert torch.equal(run.file["token_ids"], alone.file["token_ids"])
    if shared >= STEP:  # a hit past the first step's end (what the GPU run got wrong)
        assert max(hits) >= STEP - STEP % block, hits
    if shared < block:
        assert hits == [0, 0]
    return hits


@pytest.mark.parametrize("case", list(SHARED))
def test_the_file_after_a_hit_is_the_uncached_file(shim, tmp_path, case):
    check(tmp_path, case)


@pytest.mark.skipif(OURS, reason="0.22-0.23: vLLM's connector refuses chunked prefill")
@pytest.mark.parametrize("case", ["across-two-steps", "whole-prompt"])
def test_vllms_own_connector_saves_the_cached_tokens_too(shim, tmp_path, case):
    """vLLM issue 44485 does not reproduce from 0.24: the save covers the hit's blocks."""
    with without(*CONNECTOR_PATCHES):
        assert not set(CONNECTOR_PATCHES) & {p.id for p in PATCHER.selected}
        assert max(check(tmp_path, case)) > 0
