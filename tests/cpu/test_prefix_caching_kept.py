"""Prefix caching stays on for hybrid extraction (issue 17): vLLM's real config code.

From vLLM 0.22 the plugin keeps the prefix caching asked for, and vLLM then caches the GDN state
in 'align' mode (which needs chunked prefill). On 0.22-0.23 it stays on with our connector
(hidden-states-chunked-prompts, chunked prefill on); where vLLM's own connector is kept
(`--no-enable-chunked-prefill`), which refuses chunked prefill, no-prefix-caching-for-hybrid-
extraction turns it off. Stock 0.22-0.23 with chunked prefill off is what that patch fixes.
"""

from __future__ import annotations

import pytest
import vllm
from conftest import model_dir
from packaging.version import Version

from speculators_hybrid import planning
from speculators_hybrid.registry import base_version
from speculators_hybrid.vllm_patches.prefix_caching import PATCH as NO_PREFIX_CACHING

pytestmark = pytest.mark.skipif(
    base_version(vllm.__version__) < Version("0.22"), reason="vLLM < 0.22: our own connector"
)


def _caching(chunked: bool | None = None) -> tuple[bool, str]:
    setup = planning.Setup(
        model=model_dir("tiny"),
        layer_ids=(1, 2),
        prefix_caching=True,
        max_model_len=4096,
        chunked_prefill=chunked,
    )
    cache = planning.engine_config(setup).cache_config
    return bool(cache.enable_prefix_caching), str(cache.mamba_cache_mode)


@pytest.mark.shim_only  # the connector choice on 0.22-0.23 is the plugin's
def test_prefix_caching_asked_for_stays_on_for_hybrid_extraction(shim):
    assert _caching() == (True, "align")


@pytest.mark.shim_only
@pytest.mark.skipif(
    not NO_PREFIX_CACHING.needed_for(vllm.__version__), reason="vLLM's connector takes chunks"
)
def test_without_chunked_prefill_vllms_connector_gets_caching_off(shim):
    assert _caching(chunked=False) == (False, "none")
