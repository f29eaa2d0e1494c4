"""The session's model facts are cached before the tests ask (model_info_cache: CI time)."""

from __future__ import annotations

import model_info_cache


def test_vllm_finds_every_family_class_in_the_warm_cache():
    from vllm.model_executor.models.registry import ModelRegistry, _LazyRegisteredModel

    lazy = [
        model
        for arch in model_info_cache.ARCHITECTURES
        if isinstance(model := ModelRegistry.models.get(arch), _LazyRegisteredModel)
        and model.module_name.startswith("vllm.")
    ]
    assert lazy, "no family class is registered lazily: nothing to cache"
    for model in lazy:
        assert model._get_cache_dir() == model_info_cache.cache_root() / "modelinfos"
    missing = {m._get_cache_filename() for m in lazy} - model_info_cache.cached()
    assert sorted(missing) == []
