"""no-prefix-caching-for-mamba-all-mode (vLLM 0.25.0) and the opt-in's refusal on 0.22-0.31:
vLLM's real config code decides the Mamba cache mode of each family's published config.

vLLM caches a model's Mamba state per block ('all' mode) where its class supports Mamba prefix
caching (Nemotron-H, Granite 4.0-H, Falcon-H1, Zamba2, Jamba) and in 'align' mode otherwise
(LFM2's short convolutions, Qwen3.5's GDN). With extraction, 'all' mode stops the engine core
on a 1-token prefill chunk on vLLM 0.22-0.31 (mamba_all_mode.py says where): there prefix
caching asked for must come out off for the first kind and stay on for the second where the
plugin keeps it (0.25.0 by default, the other releases with the opt-in).
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
from speculators_hybrid.vllm_patches.mamba_all_mode import CRASHES
from speculators_hybrid.vllm_patches.mamba_all_mode import PATCH as ALL_MODE
from speculators_hybrid.vllm_patches.prefix_caching import OPT_IN_ENV

RELEASE = base_version(installed("vllm") or "0")
pytestmark = pytest.mark.skipif(
    RELEASE not in SpecifierSet(">=0.22"), reason="the families extract from vLLM 0.22"
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


@pytest.mark.shim_only  # stock vLLM's own choice, and the opt-in (the plugin's)
def test_all_mode_models_lose_prefix_caching_where_the_engine_would_stop(tmp_path, monkeypatch):
    monkeypatch.setenv(OPT_IN_ENV, "1")  # keeps caching on where the plugin may (not 0.25.0's)
    crashes = RELEASE in SpecifierSet(CRASHES)
    if ALL_MODE.needed_for(str(RELEASE)):
        assert _caching(tmp_path, "nemotron-h-8b", shim=False) == (True, "all")  # stock vLLM
    for preset in ("nemotron-h-8b", "jamba-mini-1.5"):  # Mamba2 and Mamba1 layers
        on, mode = _caching(tmp_path, preset, shim=True)
        assert on is not crashes, (preset, mode)  # 0.32+ keep it (and may pick 'align' there)
    # a model in 'align' mode keeps the prefix caching asked for
    assert _caching(tmp_path, "lfm2-2.6b", shim=True) == (True, "align")


@pytest.mark.skipif(not ALL_MODE.needed_for(str(RELEASE)), reason="vLLM 0.25.0 only")
def test_on_0_25_0_all_mode_is_off_and_align_mode_stays_without_opt_in(tmp_path, monkeypatch):
    monkeypatch.delenv(OPT_IN_ENV, raising=False)
    assert _caching(tmp_path, "granite-4.0-h-small", shim=True)[0] is False
    assert _caching(tmp_path, "lfm2-2.6b", shim=True) == (True, "align")
