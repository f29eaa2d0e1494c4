"""no-prefix-caching-for-hybrid-extraction's opt-in (issue 17): vLLM's real config code.

Without SPECULATORS_HYBRID_PREFIX_CACHING the patch turns prefix caching off for hybrid
extraction on vLLM >= 0.22; with it, caching stays on (and vLLM then caches the GDN state in
'align' mode, which needs chunked prefill). On 0.22-0.23 it stays on with our connector
(hidden-states-chunked-prompts, chunked prefill on) and is still turned off where vLLM's own
connector is kept (`--no-enable-chunked-prefill`), since that one refuses chunked prefill.
"""

from __future__ import annotations

import pytest
import vllm
from conftest import model_dir

from speculators_hybrid import planning
from speculators_hybrid.registry import base_version
from speculators_hybrid.vllm_patches.prefix_caching import OPT_IN_ENV, STOCK_TAKES_CHUNKS
from speculators_hybrid.vllm_patches.prefix_caching import PATCH as NO_PREFIX_CACHING

pytestmark = pytest.mark.skipif(
    not NO_PREFIX_CACHING.needed_for(vllm.__version__), reason="the patch is not armed here"
)


def _caching(monkeypatch, opt_in: str | None, chunked: bool | None = None) -> tuple[bool, str]:
    if opt_in is None:
        monkeypatch.delenv(OPT_IN_ENV, raising=False)
    else:
        monkeypatch.setenv(OPT_IN_ENV, opt_in)
    setup = planning.Setup(
        model=model_dir("tiny"),
        layer_ids=(1, 2),
        prefix_caching=True,
        max_model_len=4096,
        chunked_prefill=chunked,
    )
    cache = planning.engine_config(setup).cache_config
    return bool(cache.enable_prefix_caching), str(cache.mamba_cache_mode)


@pytest.mark.shim_only  # the opt-in is the plugin's; the diffs in patches/ have none
def test_prefix_caching_is_off_unless_opted_in_where_it_can_run(shim, monkeypatch):
    assert _caching(monkeypatch, None) == (False, "none")
    assert _caching(monkeypatch, "0") == (False, "none")
    assert _caching(monkeypatch, "1") == (True, "align")
    if base_version(vllm.__version__) < STOCK_TAKES_CHUNKS:  # vLLM's connector, no chunks
        assert _caching(monkeypatch, "1", chunked=False) == (False, "none")
