"""tox.ini and the locks are what scripts/matrix.py makes from speculators_hybrid/support.py."""

from __future__ import annotations

import importlib.util
import sys
from functools import cache
from pathlib import Path

from speculators_hybrid import support

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "matrix.py"


@cache
def _matrix():
    spec = importlib.util.spec_from_file_location("matrix", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["matrix"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_tox_ini_and_every_lock_are_up_to_date():
    assert _matrix().problems() == []


def test_the_releases_are_listed_in_release_order():
    """support.OLDEST / NEWEST and the tables' ranges read the list in its order."""
    from packaging.version import Version

    assert list(support.VLLM) == sorted(support.VLLM, key=Version)
    assert (support.OLDEST, support.NEWEST) == (
        min(support.VLLM, key=Version),
        max(support.VLLM, key=Version),
    )


def test_every_release_has_an_env_that_installs_it_from_its_lock():
    matrix = _matrix()
    for release in support.VLLM:
        lock = matrix.LOCKS / f"vllm-{release}.txt"
        assert f"vllm=={release}\n" in lock.read_text()
        assert "torch==2.13.0+cpu\n" in lock.read_text()  # the override, not a CUDA build


def test_a_stale_tox_ini_is_reported(tmp_path, monkeypatch):
    matrix = _matrix()
    (tmp_path / "tox.ini").write_text(matrix.tox_ini().replace("vllm-0.24.0", "vllm024"))
    for page in matrix.PAGES:
        (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / page).write_text((matrix.ROOT / page).read_text())
    monkeypatch.setattr(matrix, "ROOT", tmp_path)
    assert any("tox.ini differs" in p for p in matrix.problems())


def test_a_stale_or_missing_generated_block_is_reported(tmp_path, monkeypatch):
    """Each page keeps its generated blocks: a count edited by hand, or markers lost, fails."""
    matrix = _matrix()
    (tmp_path / "tox.ini").write_text(matrix.tox_ini())
    for page in matrix.PAGES:
        (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / page).write_text((matrix.ROOT / page).read_text())
    readme = tmp_path / "README.md"
    readme.write_text(readme.read_text().replace(" tox envs", " environments"))
    support = tmp_path / "docs" / "support.md"
    support.write_text(support.read_text().replace(matrix.FAMILY_END, ""))
    monkeypatch.setattr(matrix, "ROOT", tmp_path)
    found = matrix.problems()
    assert any(p.startswith("README.md's tables are stale") for p in found), found
    assert any("docs/support.md has no markers" in p for p in found), found


def test_the_summary_counts_come_from_the_matrix():
    matrix = _matrix()
    text = " ".join(matrix.summary().split())
    assert f"{len(support.VLLM)} releases, {support.OLDEST} to {support.NEWEST}" in text
    assert f"{len(matrix.envs())} tox envs" in text


def test_a_lock_made_for_other_requirements_is_reported(tmp_path, monkeypatch):
    matrix = _matrix()
    for lock in matrix.LOCKS.iterdir():
        (tmp_path / lock.name).write_text(lock.read_text())
    (tmp_path / "unit.txt").write_text("# old\npytest==7.0\n")
    monkeypatch.setattr(matrix, "LOCKS", tmp_path)
    assert any("unit.txt was made for other requirements" in p for p in matrix.problems())


def test_release_lists_name_runs_and_keep_gaps():
    """A patch retired on one release inside its range: two runs, neither hides the gap."""
    matrix = _matrix()
    vllm = list(support.VLLM)
    gap = vllm.index("0.25.0")
    text = matrix._releases("vllm", vllm[4:gap] + vllm[gap + 1 :])
    assert text == f"vLLM 0.22.0 – 0.24.0 (4), 0.25.1 – {vllm[-1]} ({len(vllm) - gap - 1})"
    assert matrix._releases("vllm", ["0.22.0", "0.22.1", "0.23.0"]) == "vLLM 0.22.0, 0.22.1, 0.23.0"


def test_a_gap_in_a_patch_range_is_not_called_fixed():
    from speculators_hybrid.registry import Patch

    matrix = _matrix()
    patch = Patch(
        id="x", project="vllm", versions=">=0.22,!=0.25.0", fixed_upstream="", why="", targets=()
    )
    assert matrix._cell(patch, "0.25.0") == matrix.NOT_NEEDED
    assert matrix._cell(patch, "0.25.1") == matrix.APPLIED
    ended = Patch(
        id="y", project="vllm", versions=">=0.20,<0.22", fixed_upstream="", why="", targets=()
    )
    assert matrix._cell(ended, "0.25.0") == matrix.FIXED


def test_family_gpu_cells_come_from_matched_result_cases(tmp_path):
    import json

    def case(vllm: str, problems: list[str], matched: bool = True) -> dict:
        return {"vllm": vllm, "problems": problems, **({"min_cos_per_id": {}} if matched else {})}

    cases = {
        "qwen3_5-multimodal-prefix-on": case("0.20.1", []),
        "qwen3_5-text-prefix-off": case("0.24.0", []),
        "jamba-prefix-off": case("0.25.0", ["a file short"]),  # failed: not a proof
        "serve-multimodal-tp2-prefix-on": case("0.25.0", [], matched=False),  # no HF match
    }
    (tmp_path / "run.json").write_text(json.dumps({"cases": cases}))
    (tmp_path / "other.json").write_text(json.dumps({"cases": {"lfm2-x": case("0.25.0", [])}}))
    assert _matrix().gpu_matched_families(tmp_path) == {
        "qwen3_5": {"0.20.1"},
        "qwen3_5_text": {"0.24.0"},
        "lfm2": {"0.25.0"},
    }


def test_the_proven_dates_are_those_of_runs_whose_files_matched(tmp_path):
    import json

    matched = {"cases": {"lfm2-x": {"vllm": "0.25.0", "problems": [], "min_cos_per_id": {}}}}
    (tmp_path / "vllm-0.25.0-h200-2026-12-02-families.json").write_text(json.dumps(matched))
    (tmp_path / "vllm-0.20.1-h200-2026-11-29.json").write_text(json.dumps(matched))
    (tmp_path / "acceptance-2026-12-07-vllm0.20.1-h100.json").write_text('{"drafters": {}}')
    assert _matrix()._run_dates(tmp_path) == "2026-11-29 to 2026-12-02"


def test_the_gpu_row_names_the_runner_each_matched_run_recorded(tmp_path):
    import json

    def case(vllm, runner=None, problems=()):
        found = {"vllm": vllm, "problems": list(problems), "min_cos_per_id": {}}
        return found | ({"runner": runner} if runner else {})

    cases = {
        "lfm2-a": case("0.25.0"),  # written before results recorded the runner: V1
        "lfm2-b": case("0.34.0", "V2"),
        "lfm2-c": case("0.30.0", "V1"),
        "lfm2-d": case("0.30.0", "V2"),
        "lfm2-e": case("0.31.0", "V2", problems=["a file short"]),  # failed: not a proof
    }
    (tmp_path / "run.json").write_text(json.dumps({"cases": cases}))
    assert _matrix().gpu_proven(tmp_path) == {"0.25.0": "V1", "0.30.0": "V1+V2", "0.34.0": "V2"}
