"""patches/vllm/<installed release>: the diffs apply, and they are the same fix as the shim.

1. Every runtime patch the release needs has a diff, and each diff applies, in order, to the
   installed release (pristine: tox installs its wheel).
2. tests/cpu pass against a copy of the installed vLLM with the diffs applied and the shim
   off (SPECULATORS_HYBRID_DISABLE=1, SPECULATORS_HYBRID_PATCHED_VLLM=1; see
   tests/cpu/conftest.py for what that mode skips), and the tests that cover the diffs ran.
"""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from patched_release import REPO, ROOT, check_failures, patched, release

from speculators_hybrid import upstream

VERSION = release("vllm")

pytestmark = pytest.mark.skipif(VERSION is None, reason="needs an installed vLLM release")

# Tests that must pass (not only skip) against the patched source, and where: they exercise
# the diffs.
MUST_PASS = {
    "test_hidden_states_get_a_group_of_their_own": "<0.22",
    "test_non_hybrid_planning_is_vllms_own": "<0.22",
    "test_engine_block_size_stays_the_models": "<0.22",
    "test_store_and_read_round_trip_through_the_padded_view": "<0.22",
    "test_a_chunked_prompt_gives_one_complete_file_from_the_hidden_group": "<0.22",
    "test_with_shim_the_engine_keeps_the_models_block_size": ">=0.24",
    "test_padding_slots_leave_other_groups_pages_alone": ">=0.22,<0.25",
    "test_with_the_fix_the_rows_are_the_prompts": ">=0.24,<0.25",
    "test_a_long_request_costs_its_own_bytes": "",
    "test_vllms_connector_keeps_hostile_ids_inside_the_folder": ">=0.22",
    "test_aborted_requests_write_no_file": ">=0.24",
    "test_speculators_default_for_4_layers_is_refused_with_advice": "",
    "test_a_model_class_without_eagle3_is_refused_with_class_and_version": "",
    "test_engine_config_resolves_the_text_only_class": "<0.27",
    "test_model_loads_a_transformers_checkpoint": "<0.27",
    "test_hybrid_extraction_runs_on_v1_and_vllm_says_why": ">=0.29,<0.34",  # V1 runner gone
    "test_extraction_config_is_accepted": "",  # nemotron_h-eagle3 < 0.22, granitemoehybrid after
    "test_forward_returns_aux_states_at_the_ids": ">=0.22",  # Granite < 0.26: with the names diff
    "test_granite_builds_each_layer_from_the_new_type_names": ">=0.22,<0.26",
    "test_the_patched_method_gives_vllms_tokens_and_counts": "<0.22",
    "test_each_request_waits_for_the_step_that_computed_it": ">=0.24",
    "test_with_shim_the_blocks_are_causal_as_trained": "<0.26",
    "test_with_shim_the_proposer_builds_the_block_causal": "<0.23",
    "test_with_shim_each_layer_is_served_as_trained": ">=0.26",
}


def _outcomes(report: Path) -> dict[str, set[str]]:
    """Test name (parameters dropped) -> its outcomes, from a JUnit XML report."""
    found: dict[str, set[str]] = {}
    for case in ET.parse(report).iter("testcase"):
        tags = {child.tag for child in case} & {"failure", "error", "skipped"}
        name = case.get("name", "").split("[")[0]
        found.setdefault(name, set()).add(tags.pop() if tags else "passed")
    return found


# Runtime patches with no source diff, and why (patches/README.md says the same).
NO_DIFF = {
    "hidden-states-provenance": "shim-only: a vLLM label cannot name the fixes `check` reads",
    "files-whole-when-generate-returns": "shim-only: waits for our connector's off-step writes",
    "prefill-only-extraction": "shim-only: a mode of this project (launch sets it), not a vLLM fix",
    "hidden-states-wide-group": "shim-only: a layout of our connector's hidden-state group",
    "hidden-states-fp8-files": "shim-only: routes hs-connectors' fp8 connector to our writers",
    "mooncake-whole-prompts-only": "hs-connectors' Mooncake connector's code, not vLLM's",
}


def test_every_patch_this_release_needs_has_a_diff():
    from speculators_hybrid.plugin import PATCHER, vllm_patches

    needed = {p.id for p in PATCHER.select(vllm_patches())} - set(NO_DIFF)
    diffed = {d.stem.split("-", 1)[1] for d in upstream.diffs(ROOT, "vllm", str(VERSION))}
    assert sorted(needed - diffed) == [], (
        f"runtime patches without a diff in patches/vllm/{VERSION}"
    )
    assert sorted(diffed - needed) == [], "diffs of patches this release does not need"


def test_every_diff_applies_to_the_installed_release():
    assert check_failures("vllm") == []


@pytest.mark.full_tier
def test_cpu_suite_passes_against_the_patched_source(tmp_path):
    assert VERSION is not None
    copy, env = patched("vllm", tmp_path / "src")
    env["SPECULATORS_HYBRID_PATCHED_VLLM"] = "1"
    probe = "import vllm, speculators_hybrid; print(vllm.__file__, speculators_hybrid.__file__)"
    where = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    assert where.stdout.split() == [
        str(copy / "__init__.py"),
        str(REPO / "speculators_hybrid" / "__init__.py"),
    ]

    report = tmp_path / "report.xml"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs"]
        + [f"--junitxml={report}", "tests/cpu"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, done.stdout[-6000:]
    outcomes = _outcomes(report)
    must = [name for name, where in MUST_PASS.items() if VERSION in SpecifierSet(where)]
    assert [name for name in must if "passed" not in outcomes.get(name, set())] == []
