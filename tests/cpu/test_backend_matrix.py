"""speculators' hidden-state backends on a hybrid target with the plugin, on this vLLM
(speculators_hybrid/backends.py says which release each works on; `launch` refuses the rest).

Real: hs-connectors' registry builds each backend's kv-transfer config as speculators' launcher
does; vLLM's config, KV-cache plan, scheduler and the connectors vLLM's factory makes from it;
hs-connectors' fp8 encoding and `FP8Transfer` reader; its Mooncake connector's group search,
block size, scheduler side and `_write_sample` (its read of the cache). Stand-ins: CUDA streams
and events (the host is the device here) and, for Mooncake, the store the sample is put into
(a real store is tests of its own).

fp8 (hidden-states-fp8-files): the connector vLLM builds is the `file` backend's, so every
proof of that one (chunked prompts, prefix-cache hits, safe file names, folder faults, whole
prompts only, copy when ready) holds for fp8; its file is hs-connectors' format with our
provenance. mooncake (vLLM >= 0.22): it reads the hidden-state group with that group's block
size, and a prompt prefilled in chunks, and one after a prefix-cache hit, are put whole.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import pytest
import torch
from conftest import PATCHER, model_dir, needs
from reliability_rig import chunked
from safetensors import safe_open
from safetensors.torch import load_file
from upstream_worker import (  # noqa: F401 (cpu_copies: a fixture)
    VLLM,
    CpuTorch,
    cpu_copies,
    extract,
    extraction,
    hidden_group,
    plain_view,
    runner_views,
    tp_world,
)

from speculators_hybrid import backends, check, planning
from speculators_hybrid.vllm_patches.connector import (
    HiddenStatesMetadata,
    HybridHiddenStatesConnector,
    SaveRequest,
    slots_for,
)
from speculators_hybrid.vllm_patches.hma_config import CONNECTOR as OURS

hs_connectors = pytest.importorskip("hs_connectors")

pytestmark = [needs("hidden-states-fp8-files"), pytest.mark.usefixtures("cpu_copies")]

IDS = (1, 4, 5, 8)
HIDDEN = 256  # the tiny preset's


def transfer(name: str, folder: Any, extra: tuple[str, ...] = ()) -> str:
    """The kv-transfer config hs-connectors' backend builds from speculators' launcher args
    (`extra`: more of them)."""
    backend = hs_connectors.HiddenStatesBackend.registry[name]
    parser = argparse.ArgumentParser()
    backend.add_launch_args(parser)
    argv = [] if name == "mooncake" else ["--hidden-states-path", str(folder)]
    return json.dumps(backend.build_kv_transfer_config(parser.parse_args([*argv, *extra])))


def config_for(
    name: str,
    folder: Any,
    caching: bool = False,
    chunks: bool | None = None,
    extra: tuple[str, ...] = (),
) -> Any:
    setup = planning.Setup(
        model=model_dir("tiny"),
        layer_ids=IDS,
        prefix_caching=caching,
        max_model_len=4096,
        chunked_prefill=chunks,
        kv_transfer=transfer(name, folder, extra),
    )
    return planning.engine_config(setup)


def states(tokens: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(tokens, len(IDS), HIDDEN, generator=gen) * 3).to(torch.bfloat16)


def fp8_expected(hidden: torch.Tensor) -> torch.Tensor:
    """What hs-connectors' reader gives back for `hidden` written as fp8."""
    from hs_connectors.fp8_utils import dequantize_fp8_tensor, quantize_tensor_to_fp8

    return dequantize_fp8_tensor(*quantize_tensor_to_fp8(hidden))


def check_fp8_file(params: dict[str, Any], folder: Any, hidden: torch.Tensor) -> None:
    path = params["hidden_states_path"]
    assert os.path.dirname(path) == str(folder)
    # speculators' fp8 reader (it waits for the writer on the lock, as vLLM returns first)
    read = hs_connectors.FP8Transfer(folder).get_generated(params)
    raw = load_file(path)
    assert set(raw) == {"hidden_states", "hidden_states_scales", "token_ids"}
    assert raw["hidden_states"].dtype == torch.float8_e4m3fn
    assert raw["hidden_states_scales"].shape == (hidden.shape[0], 1, 1)
    with safe_open(path, "pt") as f:
        assert (f.metadata() or {})["writer"] == "speculators-hybrid"  # our writer wrote it
    assert set(read) == {"hidden_states", "token_ids"}
    assert read["token_ids"].tolist() == list(range(1, hidden.shape[0] + 1))
    assert torch.equal(read["hidden_states"], fp8_expected(hidden))
    error = (read["hidden_states"].float() - hidden.float()).abs().max()
    assert 0 < error <= hidden.float().abs().max() / 8  # quantized: close, not equal
    report = check.check_file(path)  # `check` reads it as fp8, with our provenance
    assert report.ok and report.backend == "fp8", report.to_json()
    assert not [w for w in report.warnings if w["code"] == "no_provenance"], report.warnings


@pytest.mark.parametrize("chunks", [None, False], ids=["chunked-prefill", "no-chunked-prefill"])
def test_fp8_is_the_file_backends_connector_writing_fp8(shim, tmp_path, chunks):
    fp8 = config_for("fp8", tmp_path, chunks=chunks).kv_transfer_config
    plain = config_for("file", tmp_path, chunks=chunks).kv_transfer_config
    assert (fp8.kv_connector, fp8.kv_connector_module_path) == (
        plain.kv_connector,
        plain.kv_connector_module_path,
    )
    assert fp8.kv_connector_extra_config == {
        **plain.kv_connector_extra_config,
        backends.FORMAT_KEY: backends.FP8_FORMAT,
    }


@pytest.mark.parametrize("chunks", [None, False], ids=["chunked-prefill", "no-chunked-prefill"])
def test_fp8_file_is_hs_connectors_format_with_provenance(shim, tmp_path, chunks):
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    config = config_for("fp8", tmp_path, chunks=chunks)
    assert config.scheduler_config.disable_hybrid_kv_cache_manager is False
    hidden = states(40)
    if config.kv_transfer_config.kv_connector == OURS:  # the plugin's connector's writer
        name, _ = planning.hidden_state_layer(config)
        worker = HybridHiddenStatesConnector(config, KVConnectorRole.WORKER)
        cache = torch.zeros(12, 16, len(IDS), HIDDEN, dtype=torch.bfloat16)
        worker.register_kv_caches({name: cache})
        slots = slots_for([9, 2, 4], 16, len(hidden))
        cache[slots // 16, slots % 16] = hidden
        path = os.path.join(tmp_path, "r.safetensors")
        tokens = list(range(1, len(hidden) + 1))
        worker.bind_connector_metadata(
            HiddenStatesMetadata([SaveRequest("r", path, tokens, slots)])
        )
        worker.save_kv_layer(name, cache, None)
        worker.shutdown()
        params = {"hidden_states_path": path}
    else:  # vLLM's connector, our patches on it: a client's id with a path in it stays inside
        kv = planning.plan(config, planning.layer_specs(config), 64 << 20)
        with extraction(config, kv) as ex:
            params = extract(ex, "../../escape", hidden)
    check_fp8_file(params, tmp_path, hidden)


# ---- Mooncake ----


class Store:
    """Stands in for the Mooncake store: keeps what the connector puts."""

    def __init__(self) -> None:
        self.samples: dict[str, dict[str, torch.Tensor]] = {}

    def setup(self) -> None:
        return None

    def put_sample(self, manifest: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        self.samples[manifest["handle"]] = {k: v.clone() for k, v in tensors.items()}

    def put_error(self, manifest: dict[str, Any], reason: str) -> None:
        raise AssertionError(f"{manifest['handle']}: {reason}")


def prefix_rows(prompt: list[int]) -> torch.Tensor:
    """A stand-in model's rows: each a function of the prefix up to it (as a causal model's)."""
    out, acc = [], 0
    for pos, token in enumerate(prompt):
        acc = (acc * 31 + token + 7 * pos) % 997
        out.append(torch.arange(len(IDS) * HIDDEN).reshape(len(IDS), HIDDEN) % 251 + acc)
    return torch.stack(out).to(torch.bfloat16)  # integers below 256: exact


def test_mooncake_reads_the_hidden_group_whole_prompts_and_hits(shim, tmp_path, monkeypatch):
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    if not backends.BY_NAME["mooncake"].works_on(str(VLLM)):
        pytest.skip(f"vLLM {VLLM}: launch refuses mooncake (backends.py)")
    module = pytest.importorskip("hs_connectors.mooncake_hidden_states_connector")
    monkeypatch.setenv("MOONCAKE_LOCAL_HOSTNAME", "127.0.0.1")
    config = config_for("mooncake", tmp_path, caching=True)
    assert config.kv_transfer_config.kv_connector == "MooncakeHiddenStatesConnector"
    chunked(config, 512)
    kv = planning.plan(config, planning.layer_specs(config), 64 << 20)
    scheduler, request = planning.engine_scheduler(config, kv)
    gid, group = hidden_group(kv)
    block = group.kv_cache_spec.block_size
    assert isinstance(scheduler.connector, module.MooncakeHiddenStatesConnector)
    assert (scheduler.connector._hs_group_idx, scheduler.connector._block_size) == (gid, block)

    tp_world(config)
    worker = module.MooncakeHiddenStatesConnector(config, KVConnectorRole.WORKER, kv)
    worker._device_module = CpuTorch.cuda
    worker._store = store = Store()
    layer = group.layer_names[0]
    view = runner_views(config, kv)[1][layer] if VLLM.release < (0, 29) else plain_view(kv)
    worker.register_kv_caches({layer: view})
    assert worker._block_size == block

    first = [(i * 37) % 1000 + 1 for i in range(1300)]  # three prefill chunks
    # Two more sharing 1,100 tokens: from 0.29 vLLM keeps a shared prefix's GDN state once it
    # has seen it twice (test_prefix_hit_file.py), so the third may hit where the second missed.
    prompts = {
        "first": first,
        "second": first[:1100] + [5, 6, 7] * 30,
        "third": first[:1100] + [8, 9] * 40,
    }
    hits = {}
    for req_id, prompt in prompts.items():
        hits[req_id] = run(scheduler, request, worker, gid, block, view, req_id, prompt)
        sample = store.samples[module.sanitize_key(req_id)]
        assert sample["token_ids"].tolist() == prompt
        assert torch.equal(sample["hidden_states"], prefix_rows(prompt)), req_id
    if config.cache_config.enable_prefix_caching:
        assert max(hits.values()) > 0  # cached rows read where an earlier prompt wrote them
    worker._executor.shutdown(wait=True)


def run(scheduler, request, worker, gid, block, view, req_id, prompt) -> int:
    """One prompt through vLLM's scheduler and the worker connector; its prefix-cache hit."""
    from vllm.model_executor.models.extract_hidden_states import basic_cache

    rows = prefix_rows(prompt)
    scheduler.add_request(request(req_id, prompt))
    table: list[int] = []
    hit = 0
    for _ in range(40):
        out = scheduler.schedule()
        for new in out.scheduled_new_reqs:
            table, hit = list(new.block_ids[gid]), new.num_computed_tokens
        for ids in out.scheduled_cached_reqs.new_block_ids:
            table += list(ids[gid]) if ids else []
        n = out.num_scheduled_tokens.get(req_id, 0)
        done: set[str] = set()
        if n:
            end = scheduler.requests[req_id].num_computed_tokens
            basic_cache(rows[end - n : end], view, slots_for(table, block, end)[end - n :])
            done = {req_id} if end >= len(prompt) else set()
        worker.bind_connector_metadata(out.kv_connector_metadata)
        for future in list(worker._req_futures.values()):
            future.result()
        sending, _ = worker.get_finished(out.finished_req_ids)
        worker.clear_connector_metadata()
        scheduler.update_from_output(
            out, planning.model_output(out, dict.fromkeys(done, 7), frozenset(sending or ()))
        )
        if req_id not in scheduler.requests:
            return hit
    raise AssertionError(f"{req_id} did not finish")


def test_every_backend_is_in_the_registry_hs_connectors_has():
    assert {b.name for b in backends.BACKENDS} == set(hs_connectors.HiddenStatesBackend.registry)
    for b in backends.BACKENDS:
        config = json.loads(transfer(b.name, "/tmp/x"))  # noqa: S108
        assert backends.of_transfer_config(config) is b
    assert PATCHER.active
