"""no-prefix-caching-for-mamba-all-mode (vLLM 0.22-0.31): vLLM's real config code decides the
Mamba cache mode of each family's published config.

vLLM caches a model's Mamba state per block ('all' mode) where its class supports Mamba prefix
caching (Nemotron-H, Granite 4.0-H, Falcon-H1, Zamba2, Jamba) and in 'align' mode otherwise
(LFM2's short convolutions, Qwen3.5's GDN). With extraction, 'all' mode stops the engine core
on a 1-token prefill chunk on vLLM 0.22-0.31 (mamba_all_mode.py says where): there prefix
caching asked for must come out off for the first kind and stay on for the second where the
plugin keeps it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import set_shim
from packaging.specifiers import SpecifierSet

from speculators_hybrid import planning
from speculators_hybrid.family_presets import write_family_config
from speculators_hybrid.registry import base_version
from speculators_hybrid.versions import installed
from speculators_hybrid.vllm_patches.mamba_all_mode import CRASHES, all_mode, caches_all
from speculators_hybrid.vllm_patches.mamba_all_mode import PATCH as ALL_MODE

RELEASE = base_version(installed("vllm") or "0")
pytestmark = pytest.mark.skipif(
    RELEASE not in SpecifierSet(">=0.22"),
    reason="vLLM < 0.22: no assertion to avoid (Nemotron-H matched with caching on 0.20.1's GPU)",
)


def _caching(tmp_path: Path, preset: str, shim: bool) -> tuple[bool, str]:
    set_shim(shim)
    setup = planning.Setup(
        model=str(write_family_config(tmp_path / preset, preset)),
        layer_ids=(2, 4),
        prefix_caching=True,
        max_model_len=4096,
        chunked_prefill=None,
    )
    try:
        cache = planning.engine_config(setup).cache_config
    finally:
        set_shim(True)
    return bool(cache.enable_prefix_caching), str(cache.mamba_cache_mode)


@pytest.mark.shim_only  # stock vLLM's own choice beside the plugin's
def test_all_mode_models_lose_prefix_caching_where_the_engine_would_stop(tmp_path):
    # vLLM picks 'all' for these models before 0.28, 'align' from 0.28; 0.22-0.31 assert in 'all'
    stops = RELEASE in SpecifierSet(CRASHES) and caches_all(None, str(RELEASE))
    # stock 0.22-0.23 refuse their connector with chunked prefill, which caching needs here
    if RELEASE in SpecifierSet(">=0.24"):
        default = "all" if caches_all(None, str(RELEASE)) else "align"
        assert _caching(tmp_path, "nemotron-h-8b", shim=False) == (True, default)  # stock vLLM
    for preset in ("nemotron-h-8b", "jamba-mini-1.5"):  # Mamba2 and Mamba1 layers
        on, mode = _caching(tmp_path, preset, shim=True)
        assert on is not stops, (preset, mode)
        assert mode == ("none" if stops else "align"), (preset, mode)
    # a model in 'align' mode keeps the prefix caching asked for
    assert _caching(tmp_path, "lfm2-2.6b", shim=True) == (True, "align")


@pytest.mark.skipif(not ALL_MODE.needed_for(str(RELEASE)), reason="vLLM 0.22-0.31 only")
def test_an_explicit_all_mode_is_caught_on_every_release_that_asserts(tmp_path):
    """`--mamba-cache-mode all` on 0.28-0.31 (asked for, not vLLM's default there)."""
    set_shim(True)
    setup = planning.Setup(
        model=str(write_family_config(tmp_path / "granite", "granite-4.0-h-small")),
        layer_ids=(2, 4),
        prefix_caching=True,
        max_model_len=4096,
    )
    config = planning.engine_config(setup)
    if caches_all(None, str(RELEASE)):
        assert not config.cache_config.enable_prefix_caching  # turned off before vLLM chose
        config.cache_config.enable_prefix_caching = True
    config.cache_config.mamba_cache_mode = "all"
    assert all_mode(config)
    config.cache_config.mamba_cache_mode = "align"
    assert not all_mode(config)
