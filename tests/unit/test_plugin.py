"""The vLLM plugin entry point and its switches (no vLLM needed)."""

from __future__ import annotations

from importlib import metadata
from typing import Any

import pytest

from speculators_hybrid import plugin, registry, support
from speculators_hybrid.vllm_patches import PATCHES


def test_entry_point_is_declared_for_vllm():
    eps = metadata.entry_points(group="vllm.general_plugins")
    ours = [ep for ep in eps if ep.name == "speculators_hybrid"]
    assert len(ours) == 1 and ours[0].value == "speculators_hybrid.plugin:register"
    assert ours[0].load() is plugin.register


def test_off_switch_patches_nothing(monkeypatch):
    monkeypatch.setenv("SPECULATORS_HYBRID_DISABLE", "1")
    monkeypatch.setattr(registry, "PATCHER", registry.Patcher(version_of=lambda d: "0.20.1"))
    plugin.register()
    assert not plugin.PATCHER.active and plugin.PATCHER.selected == []


def test_without_vllm_nothing_is_armed(monkeypatch):
    monkeypatch.delenv("SPECULATORS_HYBRID_DISABLE", raising=False)
    monkeypatch.setattr(plugin, "installed", lambda dist: None)
    monkeypatch.setattr(registry, "PATCHER", registry.Patcher(version_of=lambda d: None))
    plugin.register()
    assert not plugin.PATCHER.active


# Every release so far: bad ids refused early, id 0 = embeddings, hidden states at their own
# page size; text-only Qwen3.5 registered until vLLM 0.27 registers it; a DFlash drafter with
# 1-D RoPE until 0.34 (no V1 proposer, which refuses M-RoPE for parallel drafting); the fp8
# backend's files written by the connector our patches serve.
EVERY = {
    "dflash-drafter-text-rope",
    "hidden-states-fp8-files",
    "check-extraction-input",
    "layer-zero-is-embeddings",
    "hidden-states-own-page-size",
    "qwen3_5-text-only-models",
    "prefill-only-extraction",  # a mode: SPECULATORS_HYBRID_PREFILL_ONLY (launch sets it)
    "granitemoehybrid-eagle3",  # EAGLE-3 aux hidden states for the families vLLM leaves out
    "falcon_h1-eagle3",
    "lfm2-eagle3",
    "jamba-eagle3",
    "lfm2_moe-eagle3",
    "zamba2-eagle3",
    "mooncake-whole-prompts-only",  # gated by hs-connectors' version, not vLLM's
}
BEFORE_022 = {
    "keep-hma-for-extraction",
    "hidden-states-own-group",
    "hidden-states-write-slots",
    "files-whole-when-generate-returns",  # our connector writes off the step
    "nemotron_h-eagle3",  # vLLM 0.22 adds SupportsEagle3 to NemotronH
    "hidden-states-wide-group",  # the default with prefix caching off
    "extraction-model-type-list",  # 0.20/0.21 refuse the families by their model type's name
    "granite-layer-type-names",
    "backup-tokens-without-sync",  # 0.22 copies them from a pinned buffer
}
WAIT = {"no-accepted-count-wait-in-prefill"}  # vLLM 0.20-0.23: 0.24 no longer waits
FROM_022 = {
    "hidden-block-divides-engine-block",
    "hidden-states-provenance",
    "hidden-states-safe-file-names",
}
NAMES = {"granite-layer-type-names"}  # vLLM 0.20-0.25: transformers >= 5.13's layer types
ALL_MODE = {"no-prefix-caching-for-mamba-all-mode"}  # 0.22-0.31: the engine core would stop
HIT = {"hidden-states-consistent-prefix-hit"}  # vLLM 0.24-0.26: the connector-hit path
CAUSAL = {"dflash-causal-draft-blocks"}  # 0.20-0.25: 0.26 sets dflash_config.causal itself
RUNNER_V1 = {"hybrid-extraction-on-model-runner-v1"}  # 0.29+ would pick Model Runner V2
FULL_LAYERS = {"dflash-full-layers-non-causal"}  # 0.26+: causal set for every layer
WHOLE = {  # 0.24+ save at request_finished, make each request's lock in wait_for_save, and
    # queue each copy a step or two after the request's own
    "hidden-states-whole-prompts-only",
    "hidden-states-folder-faults",
    "hidden-states-copy-when-ready",
}


def installed_with(vllm: str) -> Any:
    """Installed versions as the vLLM envs have them: `vllm` and the hs-connectors they pin."""
    return {"vllm": vllm, "hs-connectors": support.HS_CONNECTORS}.get


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("0.20.1", EVERY | BEFORE_022 | WAIT | CAUSAL),
        ("0.21.0", EVERY | BEFORE_022 | WAIT | CAUSAL),
        (
            "0.22.0",
            EVERY
            | FROM_022
            | NAMES
            | ALL_MODE
            | WAIT
            | CAUSAL
            | {"hidden-states-pad-slots", "hidden-states-chunked-prompts"}
            | {"no-prefix-caching-for-hybrid-extraction"},  # only with chunked prefill off
        ),
        (
            "0.24.0",
            EVERY
            | FROM_022
            | {"hidden-states-pad-slots", "hidden-states-read-slots"}
            | NAMES
            | HIT
            | WHOLE
            | ALL_MODE
            | CAUSAL,
        ),
        ("0.25.0", EVERY | FROM_022 | NAMES | HIT | WHOLE | ALL_MODE | CAUSAL),
        (
            "0.29.0",
            (EVERY - {"qwen3_5-text-only-models"})
            | FROM_022
            | RUNNER_V1
            | WHOLE
            | ALL_MODE
            | FULL_LAYERS,
        ),
        (
            "0.32.0",
            (EVERY - {"qwen3_5-text-only-models"}) | FROM_022 | RUNNER_V1 | WHOLE | FULL_LAYERS,
        ),
    ],
)
def test_each_vllm_version_selects_the_patches_it_needs(version, expected):
    patcher = plugin.Patcher(version_of=installed_with(version))
    assert {p.id for p in patcher.select(PATCHES)} == expected


def test_disabled_patches_are_not_selected(monkeypatch):
    """SPECULATORS_HYBRID_DISABLED_PATCHES turns single patches off (comma or space separated);
    an id that names no patch is reported, in one line, by `unknown_disabled`."""
    from speculators_hybrid import switches

    wait, pad = "no-accepted-count-wait-in-prefill", "hidden-states-wide-group"
    monkeypatch.setenv(switches.DISABLED_PATCHES, f" {wait}, {pad}  ")
    patcher = plugin.Patcher(version_of=installed_with("0.20.1"))
    expected = (EVERY | BEFORE_022 | WAIT | CAUSAL) - {wait, pad}
    assert {p.id for p in patcher.select(PATCHES)} == expected
    assert plugin.unknown_disabled() is None
    monkeypatch.setenv(switches.DISABLED_PATCHES, f"{wait} no-such-patch")
    problem = plugin.unknown_disabled()
    assert problem and "\n" not in problem and "names no patch: no-such-patch " in problem
    monkeypatch.setenv(switches.DISABLED_PATCHES, "")
    assert patcher.select(PATCHES) and not switches.disabled_patches()


def test_every_patch_is_documented():
    for patch in PATCHES:
        # A registration (model_registration.Registration) adds models and wraps nothing.
        assert patch.why.strip() and patch.fixed_upstream
        assert patch.targets or getattr(patch, "models", ())
        for target in patch.targets:
            assert target.fingerprints, f"{patch.id}: {target.name} has no fingerprint"


def test_role_reads_the_calling_vllm_function():
    class EngineCore:
        def __init__(self):
            self.role = plugin.role()

    def init_worker():
        return plugin.role()

    assert EngineCore().role == "engine-core"
    assert init_worker() == "worker"
    assert plugin.role() == "unknown"
