"""Each vLLM release gets the patches it needs and no others; fixed upstream means retired."""

from __future__ import annotations

from conftest import PATCHER, VLLM, vllm_patches
from packaging.version import Version

from speculators_hybrid.cli import main

PROVENANCE = "hidden-states-provenance"  # upstream's connector writes from 0.22
TEXT_ONLY = "qwen3_5-text-only-models"  # vLLM registers the classes from 0.27
OWN_PAGE = "hidden-states-own-page-size"  # every release so far
PREFIX_HIT = "hidden-states-consistent-prefix-hit"  # the connector-hit path of 0.24-0.26
PAD_SLOTS = "hidden-states-pad-slots"  # 0.22-0.24; 0.25.0 clamps padding to the null block
READ_SLOTS = "hidden-states-read-slots"  # 0.24.x only
RUNNER_V1 = "hybrid-extraction-on-model-runner-v1"  # 0.29-0.33 pick V2; 0.34 has only V2
WHOLE = "hidden-states-whole-prompts-only"  # 0.24+ save at request_finished
WAIT = "no-accepted-count-wait-in-prefill"  # 0.20-0.23; 0.24 no longer waits
CHUNKS = "hidden-states-chunked-prompts"  # 0.22-0.23: our connector where the stock one refuses
NAMES = "granite-layer-type-names"  # 0.20-0.25: 0.26 maps transformers >= 5.13's layer types
BEFORE_022 = {
    TEXT_ONLY,
    "keep-hma-for-extraction",
    "hidden-states-own-group",
    "hidden-states-write-slots",
    "files-whole-when-generate-returns",
    OWN_PAGE,
    "nemotron_h-eagle3",  # vLLM 0.22 adds SupportsEagle3 to NemotronH
    "hidden-states-wide-group",  # the default with prefix caching off
    "extraction-model-type-list",  # 0.20/0.21 refuse the families by their model type's name
    NAMES,
    "backup-tokens-without-sync",  # 0.22 copies them from a pinned buffer
}
NO_CACHING = "no-prefix-caching-for-hybrid-extraction"  # 0.22-0.23, chunked prefill off
ALL_MODE = "no-prefix-caching-for-mamba-all-mode"  # 0.22-0.31
FROM_022 = {
    PROVENANCE,
    "hidden-block-divides-engine-block",
    "hidden-states-safe-file-names",
    OWN_PAGE,
}

# vLLM release -> the patches it needs (the table docs/support.md shows).
NEEDED = {
    "0.20.0": BEFORE_022 | {WAIT},
    "0.20.1": BEFORE_022 | {WAIT},
    "0.20.2": BEFORE_022 | {WAIT},
    "0.21.0": BEFORE_022 | {WAIT},
    # 0.22-0.23: caching off only with vLLM's connector (no chunked prefill); 0.22-0.31: off for
    # models in Mamba cache mode 'all' (the engine core would stop on a 1-token chunk)
    "0.22.0": FROM_022 | {TEXT_ONLY, PAD_SLOTS, CHUNKS, NAMES, NO_CACHING, ALL_MODE, WAIT},
    "0.22.1": FROM_022 | {TEXT_ONLY, PAD_SLOTS, CHUNKS, NAMES, NO_CACHING, ALL_MODE, WAIT},
    "0.23.0": FROM_022
    | {TEXT_ONLY, PAD_SLOTS, CHUNKS, NAMES, NO_CACHING, ALL_MODE, WAIT},  # no READ_SLOTS
    "0.24.0": FROM_022 | {WHOLE, NAMES, ALL_MODE} | {TEXT_ONLY, PAD_SLOTS, READ_SLOTS, PREFIX_HIT},
    "0.25.0": FROM_022 | {WHOLE, TEXT_ONLY, PREFIX_HIT, NAMES, ALL_MODE},
    "0.25.1": FROM_022 | {WHOLE, NAMES, ALL_MODE} | {TEXT_ONLY, PREFIX_HIT},
    "0.26.0": FROM_022 | {WHOLE, ALL_MODE} | {TEXT_ONLY, PREFIX_HIT},
    # 0.27.0 registers the text-only classes and reconciles a diverged per-group hit
    "0.27.0": FROM_022 | {WHOLE, ALL_MODE},
    "0.27.1": FROM_022 | {WHOLE, ALL_MODE},
    "0.28.0": FROM_022 | {WHOLE, ALL_MODE},
    "0.29.0": FROM_022 | {WHOLE, ALL_MODE} | {RUNNER_V1},
    "0.30.0": FROM_022 | {WHOLE, ALL_MODE} | {RUNNER_V1},
    "0.31.0": FROM_022 | {WHOLE, ALL_MODE} | {RUNNER_V1},
    "0.32.0": FROM_022 | {WHOLE} | {RUNNER_V1},
    "0.33.0": FROM_022 | {WHOLE} | {RUNNER_V1},
    "0.34.0": FROM_022 | {WHOLE},  # the V1 model runner is gone
}
# Needed on every release in the table (no upstream fix yet).
EVERY_RELEASE = {"check-extraction-input", "layer-zero-is-embeddings", "prefill-only-extraction"}
EVERY_RELEASE |= {"hidden-states-fp8-files"}  # the fp8 backend's files through the plugin's writer
# hs-connectors' Mooncake connector, gated by hs-connectors' version (0.9.0 in every vLLM env)
EVERY_RELEASE |= {"mooncake-whole-prompts-only"}
EVERY_RELEASE |= {  # EAGLE-3 auxiliary hidden states for the hybrid families vLLM leaves out
    "granitemoehybrid-eagle3",
    "falcon_h1-eagle3",
    "lfm2-eagle3",
    "jamba-eagle3",
    "lfm2_moe-eagle3",
    "zamba2-eagle3",
}
NEEDED = {release: needed | EVERY_RELEASE for release, needed in NEEDED.items()}
# vLLM's connector makes each request's lock in wait_for_save, and queues each copy a step or
# two after the request's own, from 0.24 (no upstream fix yet)
FAULTS = "hidden-states-folder-faults"
COPY_READY = "hidden-states-copy-when-ready"
NEEDED = {r: n | ({FAULTS, COPY_READY} if WHOLE in n else set()) for r, n in NEEDED.items()}
# The V1 proposer refuses an M-RoPE drafter for parallel drafting (DFlash), 0.20-0.33
DFLASH_ROPE = "dflash-drafter-text-rope"
NEEDED = {r: n | ({DFLASH_ROPE} if r != "0.34.0" else set()) for r, n in NEEDED.items()}
# DFlash draft blocks are served non-causal whatever the drafter was trained with, until vLLM
# sets dflash_config.causal itself (0.26)
DFLASH_CAUSAL = "dflash-causal-draft-blocks"
# ... and from 0.26 it sets it for every layer, full-attention ones too (no upstream fix yet)
DFLASH_FULL = "dflash-full-layers-non-causal"
NEEDED = {
    r: n | ({DFLASH_CAUSAL} if Version(r) < Version("0.26") else {DFLASH_FULL})
    for r, n in NEEDED.items()
}


def test_installed_vllm_selects_exactly_its_patches():
    version = str(VLLM)
    assert version in NEEDED, f"add vLLM {version} to the table"
    assert {p.id for p in PATCHER.select(vllm_patches())} == NEEDED[version]


def test_patches_list_says_what_applies_here(capsys):
    assert main(["patches", "list"]) == 0
    out = capsys.readouterr().out
    version = str(VLLM)
    for patch in vllm_patches():
        state = "applies here" if patch.id in NEEDED[version] else "not needed here"
        assert f"{patch.id}  [{state}]" in out
    assert "FAILS" not in out
