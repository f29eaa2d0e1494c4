"""Each vLLM release gets the patches it needs and no others; fixed upstream means retired."""

from __future__ import annotations

from conftest import PATCHER, vllm_patches

from speculators_hybrid.cli import main
from speculators_hybrid.registry import base_version

PROVENANCE = "hidden-states-provenance"  # upstream's connector writes from 0.22
TEXT_ONLY = "qwen3_5-text-only-models"  # vLLM registers the classes from 0.27
OWN_PAGE = "hidden-states-own-page-size"  # every release so far
PREFIX_HIT = "hidden-states-consistent-prefix-hit"  # the connector-hit path of 0.24-0.28

# vLLM release -> the patches it needs (the table README.md shows).
NEEDED = {
    "0.20.1": {
        TEXT_ONLY,
        "keep-hma-for-extraction",
        "hidden-states-own-group",
        "hidden-states-write-slots",
        OWN_PAGE,
    },
    "0.21.0": {
        TEXT_ONLY,
        "keep-hma-for-extraction",
        "hidden-states-own-group",
        "hidden-states-write-slots",
        OWN_PAGE,
    },
    "0.22.1": {
        TEXT_ONLY,
        PROVENANCE,
        "hidden-states-pad-slots",
        "hidden-block-divides-engine-block",
        "no-prefix-caching-for-hybrid-extraction",
        OWN_PAGE,
    },
    "0.24.0": {
        TEXT_ONLY,
        PROVENANCE,
        "hidden-states-pad-slots",
        "hidden-states-read-slots",
        "hidden-block-divides-engine-block",
        "no-prefix-caching-for-hybrid-extraction",
        PREFIX_HIT,
        OWN_PAGE,
    },
    "0.25.0": {
        TEXT_ONLY,
        PROVENANCE,
        "hidden-block-divides-engine-block",
        "no-prefix-caching-for-hybrid-extraction",
        PREFIX_HIT,
        OWN_PAGE,
    },
    "0.29.0": {
        PROVENANCE,
        "hidden-block-divides-engine-block",
        "no-prefix-caching-for-hybrid-extraction",
        OWN_PAGE,
    },
    "0.33.0": {
        PROVENANCE,
        "hidden-block-divides-engine-block",
        "no-prefix-caching-for-hybrid-extraction",
        OWN_PAGE,
    },
}
# Needed on every release in the table (no upstream fix yet).
EVERY_RELEASE = {"check-extraction-input", "layer-zero-is-embeddings"}
for _needed in NEEDED.values():
    _needed |= EVERY_RELEASE


def test_installed_vllm_selects_exactly_its_patches():
    version = str(base_version(PATCHER.version_of("vllm") or ""))
    assert version in NEEDED, f"add vLLM {version} to the table"
    assert {p.id for p in PATCHER.select(vllm_patches())} == NEEDED[version]


def test_patches_list_says_what_applies_here(capsys):
    assert main(["patches", "list"]) == 0
    out = capsys.readouterr().out
    version = str(base_version(PATCHER.version_of("vllm") or ""))
    for patch in vllm_patches():
        state = "applies here" if patch.id in NEEDED[version] else "not needed here"
        assert f"{patch.id}  [{state}]" in out
    assert "FAILS" not in out
