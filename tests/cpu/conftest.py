"""Real vLLM on the CPU: configs, specs and plans built by vLLM's own code.

The shim is switched per test with the `shim` fixture (the process-wide `PATCHER`), since
vLLM loads our plugin by itself as soon as `EngineArgs` is used.
"""

from __future__ import annotations

import copy
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path

import pytest
from packaging.version import Version

pytest.importorskip("vllm")

import model_info_cache  # noqa: E402

from speculators_hybrid import cpu  # noqa: E402

model_info_cache.use_own_root()
cpu.prepare()
model_info_cache.warm()  # ~10 s once instead of ~10 s per model class

from vllm.plugins import load_general_plugins  # noqa: E402

load_general_plugins()  # vLLM's own loader, once per process: our entry point arms PATCHER

from speculators_hybrid import planning  # noqa: E402
from speculators_hybrid.models import write_config  # noqa: E402
from speculators_hybrid.planning import engine_scheduler, model_output  # noqa: E402, F401
from speculators_hybrid.plugin import PATCHER, vllm_patches  # noqa: E402
from speculators_hybrid.registry import base_version  # noqa: E402
from speculators_hybrid.vllm_patches.prefix_caching import STOCK_REFUSES_CHUNKED  # noqa: E402

VLLM = base_version(PATCHER.version_of("vllm") or "0")  # the installed release
# What vLLM >= 0.34 builds Qwen3.5 from on CUDA (other platforms: model_executor/models/qwen3_5.py);
# it imports, and its classes build, on the CPU too.
NVIDIA_QWEN3_5 = "vllm.models.qwen3_5.nvidia.model"
nvidia_qwen3_5 = pytest.mark.skipif(
    VLLM < Version("0.34"),
    reason=f"vLLM {VLLM} has one Qwen3.5 implementation ({NVIDIA_QWEN3_5} is new in 0.34.0)",
)

# vLLM 0.22-0.23 refuse ExampleHiddenStatesConnector with chunked prefill (config/vllm.py); Mamba
# prefix caching ("align" mode) needs chunked prefill, so they cannot cache hybrid prefixes.
NO_CHUNKED_PREFILL = STOCK_REFUSES_CHUNKED[0] <= VLLM < STOCK_REFUSES_CHUNKED[1]

# vLLM with our diffs in its source (patches/vllm, tests/upstream): the fix is vLLM's own, the
# shim stays off, and tests marked `shim_only` (the shim's machinery, our connector class, how
# unpatched vLLM fails) or using `no_shim` are skipped. The diffs' marker spec is vLLM's class.
PATCHED_VLLM = os.environ.get("SPECULATORS_HYBRID_PATCHED_VLLM") == "1"
SHIM_ONLY = (  # existing tests of that kind, by name
    "test_config_keeps_hma_and_names_our_connector",
    "test_every_target_matches_its_fingerprint_on_this_vllm",
    "test_prompt_longer_than_a_chunk_gives_one_complete_save",
    "test_prefix_cache_hit_reuses_hidden_state_blocks",
    "test_guard_turns_a_refused_file_into_a_request_error",
    "test_worker_writes_the_file_speculators_reads",
    "test_async_writes_return_first_and_readers_wait_for_whole_files",  # our connector's writer
    "test_writes_are_off_the_step_by_default",
    "test_guard_refuses_nan_or_all_zero_rows",
    "test_stock_store_cannot_write_a_padded_view",
    "test_loader_switches",
    "test_patches_list_says_what_applies_here",
    "test_doctor_json_shows_the_memory_target_met",  # doctor compares stock with the shim
    "test_torch_compile_keeps_each_behaviour[stock]",  # a name with parameters: that case only
    "test_id_zero_stays_the_embeddings",  # asserts the shim's method (and the text-only shim)
    "test_a_prefill_step_queues_no_copy_and_leaves_the_counts_as_vllm_would[stock]",
)
DIFFED: set[str] = set()  # ids of the patches whose diff this vLLM's source carries
if PATCHED_VLLM:
    from vllm.v1.kv_cache_interface import HiddenStateCacheSpec

    from speculators_hybrid import upstream
    from speculators_hybrid.vllm_patches import spec

    spec.HiddenStatesCacheSpec = HiddenStateCacheSpec  # type: ignore[misc]
    release = str(VLLM)
    DIFFED = {d.stem.split("-", 1)[1] for d in upstream.diffs(upstream.ROOT, "vllm", release)}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "shim_only: skipped against a patched vLLM source")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not PATCHED_VLLM:
        return
    skip = pytest.mark.skip(reason="tests the shim or unpatched vLLM; this vLLM has the fix")
    for item in items:
        name = getattr(item, "originalname", item.name)
        used = getattr(item, "fixturenames", ())
        listed = name in SHIM_ONLY or item.name in SHIM_ONLY
        if item.get_closest_marker("shim_only") or listed or "no_shim" in used:
            item.add_marker(skip)


IDS = (2, 32, 61, 64)  # speculators' default for 64 layers: [2, n//2, n-3, n]
MEMORY = 1 << 40  # planning only: enough for one 262,144-token request either way


SCRATCH = Path(tempfile.mkdtemp(prefix="spec-hybrid-tests-"))  # model folders, for the session


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    shutil.rmtree(SCRATCH, ignore_errors=True)


def scratch(prefix: str) -> Path:
    """A new folder under SCRATCH (removed with the session)."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir=SCRATCH))


@cache
def model_dir(preset: str, multimodal: bool = True) -> str:
    root = scratch("model-")
    return str(write_config(root / preset, preset, multimodal))


def set_shim(on: bool) -> None:
    PATCHER.revert()
    if on and not PATCHED_VLLM:
        PATCHER.apply(vllm_patches())


@pytest.fixture
def shim() -> Iterator[None]:
    set_shim(True)
    yield
    set_shim(True)


@pytest.fixture
def no_shim() -> Iterator[None]:
    set_shim(False)
    yield
    set_shim(True)


@cache
def _base_config(
    preset: str,
    ids: tuple[int, ...] | None,
    prefix_caching: bool,
    shim_on: bool,
    max_model_len: int,
    chunked_prefill: bool | None,
):
    set_shim(shim_on)
    setup = planning.Setup(
        chunked_prefill=chunked_prefill,
        model=model_dir(preset),
        layer_ids=ids,
        prefix_caching=prefix_caching,
        max_model_len=max_model_len,
    )
    return planning.engine_config(setup)


def engine_config(
    preset: str = "qwen3.6-27b",
    ids: tuple[int, ...] | None = IDS,
    prefix_caching: bool = False,
    tp: int = 1,
    max_model_len: int = 262144,
    chunked_prefill: bool | None = False if NO_CHUNKED_PREFILL else None,
):
    """A fresh copy of a real VllmConfig, built with the shim as it is now (cached: seconds).
    `chunked_prefill` None: vLLM's default (on); off by default where vLLM's connector refuses
    it (0.22-0.23: with it on there, the shim names our connector)."""
    shim_on = PATCHER.active
    config = copy.deepcopy(
        _base_config(preset, ids, prefix_caching, shim_on, max_model_len, chunked_prefill)
    )
    set_shim(shim_on)
    config.parallel_config.tensor_parallel_size = tp
    return config


LAYOUT = "VLLM_SSM_CONV_STATE_LAYOUT"  # set for the process by vLLM's CPU platform on some hosts


@contextmanager
def host_answers(answer: bool) -> Iterator[None]:
    """The host says yes (or no) to every CPU feature vLLM asks about; its env is restored."""
    import torch

    mp = pytest.MonkeyPatch()
    for name in dir(torch.cpu):
        if cpu.is_feature_probe(name):
            mp.setattr(torch.cpu, name, lambda: answer)
    mp.delenv(LAYOUT, raising=False)
    try:
        yield
    finally:
        mp.undo()


def our_connector() -> pytest.MarkDecorator:
    """Skip unless our connector writes the files on this vLLM (< 0.22; 0.22-0.23 with chunked
    prefill, hidden-states-chunked-prompts). The shim's class: shim-only."""
    selected = {p.id for p in PATCHER.select(vllm_patches())}
    ours = {"keep-hma-for-extraction", "hidden-states-chunked-prompts"} & selected
    return pytest.mark.skipif(
        PATCHED_VLLM or not ours,
        reason=f"vLLM {PATCHER.version_of('vllm')} writes with its own connector",
    )


def needs(*patch_ids: str) -> pytest.MarkDecorator:
    """Skip unless the installed vLLM needs these patches (others retire at their upstream fix)."""
    selected = {p.id for p in PATCHER.select(vllm_patches())}
    missing = [p for p in patch_ids if p not in selected]
    if PATCHED_VLLM and not missing:  # the fix must come from a diff in patches/vllm
        undiffed = [p for p in patch_ids if p not in DIFFED]
        return pytest.mark.skipif(bool(undiffed), reason=f"no diff for {undiffed} in patches/vllm")
    return pytest.mark.skipif(
        bool(missing), reason=f"vLLM {PATCHER.version_of('vllm')} does not need {missing}"
    )
