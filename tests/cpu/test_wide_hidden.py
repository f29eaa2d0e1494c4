"""hidden-states-wide-group (vLLM < 0.22; the default with prefix caching off): the hidden states
in one KV-cache group as wide as the model's, on real vLLM classes on the CPU.

The extraction model is vLLM's `ExtractHiddenStatesModel`, built the way the proposer builds
it: after the target, whose layers are in the forward context (stand-ins here, reporting the
specs the target's layers report). The plan is vLLM's planner with our patches, the cache
views the model runner's own, the writes the model's forward and our store, the read our
connector's.
"""

from __future__ import annotations

import copy
import os
from functools import cache

import pytest
import torch
from conftest import PATCHER, model_dir, needs, vllm_patches
from safetensors.torch import load_file
from upstream_worker import runner_views

from speculators_hybrid import planning, switches
from speculators_hybrid.registry import Patcher, PatchError
from speculators_hybrid.vllm_patches import wide_hidden
from speculators_hybrid.vllm_patches.connector import (
    HiddenStatesMetadata,
    HybridHiddenStatesConnector,
    SaveRequest,
    slots_for,
)
from speculators_hybrid.vllm_patches.own_page import is_hidden

pytestmark = [  # the full releases of 0.20-0.21 (0.20.1, 0.21.0): real models, minutes
    needs("hidden-states-wide-group", "hidden-states-own-group"),
    pytest.mark.full_tier,
]

IDS = (2, 32, 61, 64)
GIB20 = 20 << 30


@pytest.fixture
def wide(shim, monkeypatch):
    monkeypatch.setenv(switches.WIDE_HIDDEN, "1")


@cache
def _config(preset: str, ids: tuple[int, ...], prefix_caching: bool, max_model_len: int):
    return planning.engine_config(
        planning.Setup(
            model=model_dir(preset),
            layer_ids=ids,
            prefix_caching=prefix_caching,
            max_model_len=max_model_len,
            max_num_batched_tokens=16384 if preset == "qwen3.6-27b" else None,
        )
    )


def config_for(preset="qwen3.6-27b", ids=IDS, prefix_caching=False, max_model_len=8192):
    return copy.deepcopy(_config(preset, ids, prefix_caching, max_model_len))


def _target_layer(spec):
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase

    class TargetLayer(AttentionLayerBase):
        """A target layer as the forward context holds it: it reports its KV-cache spec."""

        def get_attn_backend(self):
            raise NotImplementedError

        def get_kv_cache_spec(self, vllm_config):
            return spec

    return TargetLayer()


def extraction_model(config):
    """vLLM's ExtractHiddenStatesModel, built while the target's layers are in the forward
    context (as `ExtractHiddenStatesProposer.load_model` builds it, after the target)."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.models.extract_hidden_states import ExtractHiddenStatesModel

    context = config.compilation_config.static_forward_context
    targets = {n: _target_layer(s) for n, s in planning.model_layer_specs(config).items()}
    context.update(targets)
    try:
        with set_current_vllm_config(config):
            model = ExtractHiddenStatesModel(vllm_config=config)
    finally:
        for name in targets:
            context.pop(name)
    return model


def specs_and_model(config):
    """Every layer's spec as one GPU worker reports it (planning.layer_specs's order: layers
    built with the default block size, then aligned), the extraction layers from the model."""
    cache_config = config.cache_config
    cache_config.block_size = planning.GPU_DEFAULT_BLOCK
    if cache_config.mamba_cache_mode == "align":
        cache_config.mamba_block_size = planning.GPU_DEFAULT_BLOCK
    model = extraction_model(config)
    planning.align_for_gpu(config)
    specs = planning.model_layer_specs(config)
    for layer in model.cache_only_layers.values():
        specs[layer.layer_name] = layer.get_kv_cache_spec(config)
    return specs, model


def kv_tokens(config, kv) -> int:
    """What vLLM logs as "GPU KV cache size: N tokens"."""
    module = planning.planner()
    concurrency = module.get_max_concurrency_for_kv_cache_config(config, kv)
    return int(concurrency * config.model_config.max_model_len)


def plan(prefix_caching: bool, memory: int = GIB20, **kw):
    config = config_for(prefix_caching=prefix_caching, **kw)
    specs, model = specs_and_model(config)
    return config, planning.plan(config, specs, memory), model


def describe(kv) -> list[tuple[str, int, int]]:
    return [
        (type(g.kv_cache_spec).__name__, len(g.layer_names), g.kv_cache_spec.block_size)
        for g in kv.kv_cache_groups
    ]


@pytest.mark.parametrize("prefix_caching", [False, True], ids=["no-prefix-cache", "prefix-cache"])
def test_the_hidden_group_is_as_wide_as_the_models(monkeypatch, shim, prefix_caching):
    monkeypatch.setenv(switches.WIDE_HIDDEN, "0")
    config, today, _ = plan(prefix_caching)
    monkeypatch.setenv(switches.WIDE_HIDDEN, "1")
    config, kv, model = plan(prefix_caching)
    print(f"prefix {prefix_caching}: today {describe(today)[-1]} x{len(today.kv_cache_groups)}")
    print(f"  {kv_tokens(config, today):,} KV tokens, {today.num_blocks} blocks")
    print(f"wide: {describe(kv)}, {kv_tokens(config, kv):,} KV tokens, {kv.num_blocks} blocks")

    # Switched off (=0): one-layer groups (48 GDN + 16 attention + 1 hidden).
    assert len(today.kv_cache_groups) == 65
    assert all(len(g.layer_names) == 1 for g in today.kv_cache_groups)
    # On: vLLM's own 4 groups of 16 (3 GDN, 1 attention) and one hidden group of 16 slices.
    assert len(kv.kv_cache_groups) == 5
    assert [len(g.layer_names) for g in kv.kv_cache_groups] == [16] * 5
    (hidden,) = [g for g in kv.kv_cache_groups if is_hidden(g.kv_cache_spec)]
    assert (
        hidden.layer_names
        == [f"cache_only_layers.64.slice{j}" for j in range(16)]
        == [layer.layer_name for layer in model.cache_only_layers.values()]
    )
    spec = hidden.kv_cache_spec
    assert (spec.num_kv_heads, spec.head_size) == (len(IDS), 5120 // 16)
    page = kv.kv_cache_groups[0].kv_cache_spec.page_size_bytes
    assert spec.page_size_bytes == page  # padded to the shared page: every page of a block used
    engine_block = min(g.kv_cache_spec.block_size for g in kv.kv_cache_groups[:4])
    if prefix_caching:  # cache hits keep the model's granularity
        assert engine_block % spec.block_size == 0
    else:  # as many tokens as fit the 16 pages of a block
        assert spec.block_size == page * 16 // (len(IDS) * 5120 * 2)
    # Each of the 16 pool tensors holds one layer of every group, the hidden slices included.
    assert len(kv.kv_cache_tensors) == 16
    assert all(len(t.shared_by) == 5 for t in kv.kv_cache_tensors)
    # Hidden tokens per page (the Qwen3.6-27B config, GDN state in float32): as many as a
    # one-layer group fits (1,280 / 16 vs 80); with prefix caching fewer (800 / 16 vs 80: the
    # block must divide the engine's 800, and 1,600 > 1,280).
    (today_hidden,) = [g for g in today.kv_cache_groups if is_hidden(g.kv_cache_spec)]
    assert spec.block_size / 16 >= today_hidden.kv_cache_spec.block_size * (
        0.6 if prefix_caching else 1
    )
    # What vLLM reports: max_model_len 8192 rounds up to whole blocks of 16 pages (7 x 1,280
    # tokens without prefix caching; 11 x 800 with it) where today rounds to single pages:
    # 139,605 against 143,152 KV tokens (2.5% fewer), 108,081 against 126,908 with prefix
    # caching (14.8% fewer; vLLM 0.20.1, 2026-12-06).
    assert kv_tokens(config, kv) >= kv_tokens(config, today) * (0.84 if prefix_caching else 0.97)


@pytest.mark.parametrize(
    ("value", "prefix_caching", "groups"),
    [(None, False, 5), (None, True, 65), ("1", True, 5), ("0", False, 65)],
    ids=["default-no-prefix-cache", "default-prefix-cache", "forced-on", "forced-off"],
)
def test_wide_by_default_where_prefix_caching_is_off(
    monkeypatch, shim, value, prefix_caching, groups
):
    """Unset: W layers with prefix caching off (vLLM 0.20-0.21's default for hybrids), one
    layer with it on (W-page blocks would cost 14.8% of the KV tokens); the variable decides
    where set."""
    if value is None:
        monkeypatch.delenv(switches.WIDE_HIDDEN, raising=False)
    else:
        monkeypatch.setenv(switches.WIDE_HIDDEN, value)
    config, kv, model = plan(prefix_caching)
    assert len(kv.kv_cache_groups) == groups
    assert len(model.cache_only_layers) == (16 if groups == 5 else 1)


@pytest.mark.parametrize("prefix_caching", [False, True], ids=["no-prefix-cache", "prefix-cache"])
def test_doctor_plans_the_engines_layout(monkeypatch, shim, prefix_caching):
    """`planning.layer_specs(wide=True)` (doctor's plan) = the plan of the real model's layers."""
    monkeypatch.delenv(switches.WIDE_HIDDEN, raising=False)
    config, engine, _ = plan(prefix_caching)
    doctor_config = config_for(prefix_caching=prefix_caching)
    doctor = planning.plan(doctor_config, planning.layer_specs(doctor_config, wide=True), GIB20)
    assert describe(doctor) == describe(engine)
    assert doctor.num_blocks == engine.num_blocks
    assert kv_tokens(doctor_config, doctor) == kv_tokens(config, engine)


def test_engine_block_size_stays_the_models(wide):
    """With prefix caching the scheduler's and hash block sizes are the model's (engine_block)."""
    from conftest import engine_scheduler

    config, kv, _ = plan(True)
    scheduler, _ = engine_scheduler(config, kv)
    assert config.cache_config.block_size == min(
        g.kv_cache_spec.block_size for g in kv.kv_cache_groups if not is_hidden(g.kv_cache_spec)
    )


def test_hidden_size_not_divisible_keeps_one_layer(wide, monkeypatch):
    monkeypatch.setattr(wide_hidden, "target_width", lambda vllm_config: 7)  # 5120 % 7 != 0
    config, kv, model = plan(False)
    assert len(model.cache_only_layers) == 1
    assert len(kv.kv_cache_groups) == 65  # today's split


def test_non_hybrid_target_keeps_one_layer(wide):
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    spec = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.bfloat16)
    assert wide_hidden.group_width([spec] * 8) == 1


def test_width_is_vllms_group_size():
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

    full = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.bfloat16)
    state = MambaSpec(block_size=16, shapes=((4, 8),), dtypes=(torch.bfloat16,))
    assert wide_hidden.group_width([full] * 16 + [state] * 48) == 16  # min: 48 >= 1.5 x 16
    assert wide_hidden.group_width([full] * 12 + [state] * 13) == 13  # max: 13 < 1.5 x 12


# ---- the round trip: model forward -> W caches -> connector file ----


def _round_trip(config, tmp_path, blocks_of: dict[str, list[int]], lengths_for):
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.forward_context import set_forward_context
    from vllm.v1.worker.utils import bind_kv_cache

    specs, model = specs_and_model(config)
    kv = planning.plan(config, specs, 96 << 20)
    (gid,) = [i for i, g in enumerate(kv.kv_cache_groups) if is_hidden(g.kv_cache_spec)]
    hidden = kv.kv_cache_groups[gid]
    raw, caches = runner_views(config, kv)
    context = config.compilation_config.static_forward_context
    layers = {n: context[n] for n in hidden.layer_names}
    bind_kv_cache({n: caches[n] for n in hidden.layer_names}, layers, [])
    before = {n: raw[n].clone() for n in raw}

    block = hidden.kv_cache_spec.block_size
    lengths = lengths_for(block)
    slots = {r: slots_for(blocks_of[r], block, lengths[r]) for r in lengths}
    padding = torch.full((5,), -1, dtype=torch.int64)  # CUDA-graph padding tokens
    mapping = torch.cat([*slots.values(), padding])
    hf = config.speculative_config.draft_model_config.hf_config
    n_ids, size = len(hf.eagle_aux_hidden_state_layer_ids), config.model_config.get_hidden_size()
    states = torch.randn(len(mapping), n_ids, size).to(torch.bfloat16)
    with set_forward_context(
        {n: None for n in layers},
        config,
        num_tokens=len(mapping),
        slot_mapping={n: mapping for n in layers},
    ):
        model(hidden_states=states)

    config.kv_transfer_config.kv_connector_extra_config.update(
        shared_storage_path=str(tmp_path), async_writes=False
    )
    connector = HybridHiddenStatesConnector(config, KVConnectorRole.WORKER)
    connector.register_kv_caches(caches)
    saves, start = [], 0
    for r, s in slots.items():
        path = str(tmp_path / f"{r}.safetensors")
        saves.append((path, states[start : start + len(s)]))
        start += len(s)
    connector.bind_connector_metadata(
        HiddenStatesMetadata(
            [
                SaveRequest(r, p, list(range(lengths[r])), slots[r])
                for r, (p, _) in zip(slots, saves, strict=True)
            ]
        )
    )
    for name in hidden.layer_names:  # as the decorator calls it, after each layer's write
        connector.save_kv_layer(name, caches[name], None)
        if name != hidden.layer_names[-1]:
            assert not any(os.path.exists(p) for p, _ in saves)  # only after the last slice
    connector.shutdown()
    return kv, hidden, raw, before, saves, lengths


@pytest.mark.parametrize("preset", ["tiny", "wide-8l"])
def test_round_trip_gives_todays_file(wide, tmp_path, preset):
    config = config_for(preset=preset, ids=(2, 5, 8), max_model_len=1024)
    blocks_of = {"a": [7, 3], "b": [5], "c": [2, 9, 4]}  # out of order, as the pool hands out

    def lengths_for(block: int) -> dict[str, int]:  # the last block of each partly filled
        return {"a": block + 7, "b": 5, "c": 2 * block + 11}

    kv, hidden, raw, before, saves, lengths = _round_trip(config, tmp_path, blocks_of, lengths_for)
    width = len(hidden.layer_names)
    assert width == max(len(g.layer_names) for g in kv.kv_cache_groups) > 1
    assert all(len(t.shared_by) == len(kv.kv_cache_groups) for t in kv.kv_cache_tensors)
    for path, expected in saves:
        data = load_file(path)
        assert data["hidden_states"].dtype == torch.bfloat16
        assert torch.equal(data["hidden_states"], expected)  # [tokens, ids, hidden], exactly
    # Only the requests' blocks and the null block 0 (padding slots) changed, in every tensor
    # (the other groups' blocks in the shared tensors did not), nor the hidden page padding.
    page = hidden.kv_cache_spec.page_size_bytes
    block = hidden.kv_cache_spec.block_size
    used = {b for r, bl in blocks_of.items() for b in bl[: -(-lengths[r] // block)]}
    for name in raw:
        changed = (raw[name] != before[name]).view(-1, page).any(dim=1).nonzero().flatten()
        assert set(changed.tolist()) <= {0, *used}, name
    real = hidden.kv_cache_spec.real_page_size_bytes
    for name in hidden.layer_names:
        changed = (raw[name] != before[name]).view(-1, page).any(dim=1).nonzero().flatten()
        assert used <= set(changed.tolist())
        tail = raw[name].view(-1, page)[:, real:]
        assert torch.equal(tail, before[name].view(-1, page)[:, real:])


def test_the_proposer_takes_the_w_layers_of_one_group(wide, monkeypatch):
    from vllm.model_executor import model_loader
    from vllm.v1.spec_decode import extract_hidden_states as proposers
    from vllm.v1.spec_decode.extract_hidden_states import ExtractHiddenStatesProposer

    config = config_for(preset="tiny", ids=(2, 5, 8), max_model_len=4096)
    specs, model = specs_and_model(config)
    kv = planning.plan(config, specs, 64 << 20)
    context = config.compilation_config.static_forward_context
    names = [layer.layer_name for layer in model.cache_only_layers.values()]
    drafted = {n: context.pop(n) for n in names}  # as before the drafter is built

    def get_model(vllm_config, model_config):
        context.update(drafted)
        return model

    monkeypatch.setattr(model_loader, "get_model", get_model)
    proposer = ExtractHiddenStatesProposer(config, torch.device("cpu"))
    proposer.load_model(None)
    assert proposer.attn_layer_names == names and len(names) == 2
    assert proposer.attn_metadata_builder.layer_names == names
    proposer.validate_same_kv_cache_group(kv)

    # One step through the real propose: the hidden group's own slot mapping (one for the W
    # layers, hidden-states-write-slots), the forward writing every slice.
    from types import SimpleNamespace

    from vllm.v1.worker.utils import bind_kv_cache

    _, caches = runner_views(config, kv)
    bind_kv_cache({n: caches[n] for n in names}, drafted, [])
    (hidden,) = [g for g in kv.kv_cache_groups if is_hidden(g.kv_cache_spec)]
    block = hidden.kv_cache_spec.block_size
    own = slots_for([3, 1], block, block + 4)
    tokens = len(own)
    common = SimpleNamespace(causal=True, slot_mapping=torch.zeros(tokens, dtype=torch.int64))
    states = [torch.randn(tokens, 256).to(torch.bfloat16) for _ in range(3)]
    proposer.propose(
        sampled_token_ids=torch.zeros(2, 1, dtype=torch.int64),
        target_hidden_states=states,
        common_attn_metadata=common,
        slot_mappings={n: own for n in names},
    )
    from speculators_hybrid.vllm_patches.connector import read_wide

    assert torch.equal(read_wide([caches[n] for n in names], own), torch.stack(states, dim=1))

    PATCHER.revert()  # vLLM's own: exactly one layer
    try:
        for n in names:
            context.pop(n)  # as before the drafter is built
        monkeypatch.setattr(proposers, "get_model", get_model)  # the name upstream imported
        with pytest.raises(AssertionError, match="exactly one"):
            ExtractHiddenStatesProposer.load_model(proposer, None)
    finally:
        PATCHER.apply(vllm_patches())


def test_fails_closed_when_a_target_changes(monkeypatch):
    """A changed target: nothing of the patch set stays applied, and the error names it."""
    from vllm.model_executor.models import extract_hidden_states as models

    patcher = Patcher(version_of=PATCHER.version_of)
    PATCHER.revert()
    try:
        original = models.ExtractHiddenStatesModel.forward

        def forward(self, hidden_states):  # a fork's forward, not the code the patch wraps
            return original(self, hidden_states)

        monkeypatch.setattr(models.ExtractHiddenStatesModel, "forward", forward)
        init = models.ExtractHiddenStatesModel.__init__
        with pytest.raises(PatchError, match="ExtractHiddenStatesModel.forward"):
            patcher.apply([wide_hidden.PATCH])
        assert models.ExtractHiddenStatesModel.__init__ is init  # restored
        assert patcher.applied() == []
    finally:
        patcher.revert()
        monkeypatch.undo()
        PATCHER.apply(vllm_patches())
