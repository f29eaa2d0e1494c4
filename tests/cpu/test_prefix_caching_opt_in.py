"""no-prefix-caching-for-hybrid-extraction's opt-in (issue 17): vLLM's real config code.

Without SPECULATORS_HYBRID_PREFIX_CACHING the patch turns prefix caching off for hybrid
extraction on vLLM >= 0.22; with it, caching stays on from 0.24 (and vLLM then caches the GDN
state in 'align' mode) and is still turned off on 0.22-0.23, whose connector refuses the
chunked prefill that mode needs.
"""

from __future__ import annotations

import pytest
import vllm
from conftest import model_dir

from speculators_hybrid import planning
from speculators_hybrid.vllm_patches.prefix_caching import OPT_IN_ENV, opt_in_allowed
from speculators_hybrid.vllm_patches.prefix_caching import PATCH as NO_PREFIX_CACHING

pytestmark = pytest.mark.skipif(
    not NO_PREFIX_CACHING.needed_for(vllm.__version__), reason="the patch is not armed here"
)


def _caching(monkeypatch, opt_in: str | None) -> tuple[bool, str]:
    if opt_in is None:
        monkeypatch.delenv(OPT_IN_ENV, raising=False)
    else:
        monkeypatch.setenv(OPT_IN_ENV, opt_in)
    setup = planning.Setup(
        model=model_dir("tiny"),
        layer_ids=(1, 2),
        prefix_caching=True,
        max_model_len=4096,
        chunked_prefill=None if opt_in_allowed(vllm.__version__) else False,
    )
    cache = planning.engine_config(setup).cache_config
    return bool(cache.enable_prefix_caching), str(cache.mamba_cache_mode)


@pytest.mark.shim_only  # the opt-in is the plugin's; the diffs in patches/ have none
def test_prefix_caching_is_off_unless_opted_in_where_it_can_run(shim, monkeypatch):
    assert _caching(monkeypatch, None) == (False, "none")
    assert _caching(monkeypatch, "0") == (False, "none")
    if opt_in_allowed(vllm.__version__):
        assert _caching(monkeypatch, "1") == (True, "align")
    else:  # 0.22-0.23
        assert _caching(monkeypatch, "1") == (False, "none")
