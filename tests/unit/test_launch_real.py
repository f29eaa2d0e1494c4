"""Optional: speculators' real `scripts/launch_vllm.py` files against their doubles.

Set SPECULATORS_LAUNCHERS to a folder of real scripts named by release (`v0.5.0.py`,
`v0.6.0.py`, `v0.7.0.py`, `main.py`, e.g. from `git show v0.7.0:scripts/launch_vllm.py` in a
speculators clone); needs transformers that knows qwen3_5. Skipped otherwise."""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "launchers"))
from launch_support import GENERATIONS, models  # noqa: E402

from speculators_hybrid import (
    launch,  # noqa: E402
    switches,  # noqa: E402
)
from speculators_hybrid.launcher import intercept  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Using custom target layer ids")

FOLDER = Path(os.environ.get("SPECULATORS_LAUNCHERS", "/nonexistent"))
RELEASE = {"v0.5": "0.5.0", "v0.6": "0.6.x", "v0.7": "0.7.x", "main": "main"}
REAL = sorted(FOLDER.glob("*.py")) if FOLDER.is_dir() else []
ARGS = [[], ["--target-layer-ids", "3", "6", "--", "--max-model-len", "64"], ["--port", "1"]]


def release(path: Path) -> str:
    for prefix, name in RELEASE.items():
        if path.stem.startswith(prefix):
            return name
    return pytest.skip(f"{path.name}: unknown release")  # raises


@pytest.fixture(scope="module")
def targets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    transformers = pytest.importorskip("transformers")
    if "qwen3_5" not in transformers.CONFIG_MAPPING:
        pytest.skip("transformers does not know qwen3_5")
    return models(tmp_path_factory.mktemp("models"))


@pytest.mark.skipif(not REAL, reason="SPECULATORS_LAUNCHERS names no folder of real launchers")
@pytest.mark.parametrize("real", REAL, ids=lambda p: p.stem)
@pytest.mark.parametrize("name", ["hybrid-mm", "hybrid-text", "plain"])
@pytest.mark.parametrize("args", ARGS, ids=lambda a: " ".join(a) or "defaults")
def test_real_launcher_matches_its_double(real, name, args, targets, monkeypatch):
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    double = GENERATIONS[release(real)]
    argv = [str(targets[name]), *args]
    assert (
        intercept.capture(str(real), list(argv)).argv
        == intercept.capture(str(double), list(argv)).argv
    )
    ours = launch.plan(["--launcher", str(real), *argv])
    assert ours == launch.plan(["--launcher", str(double), *argv])
    if name != "plain":  # the built-in gives what any launcher gives after our adjustments
        builtin = launch.plan(argv)
        if release(real) == "0.5.0":  # but 0.5.0's client reads files without a wait
            assert ours[0].env is not None and ours[0].env.pop(switches.ASYNC_WRITES) == "0"
            assert ours[0].argv == builtin[0].argv
            ours = (replace(ours[0], env=builtin[0].env), ours[1])
        assert ours == builtin


@pytest.mark.skipif(not REAL, reason="SPECULATORS_LAUNCHERS names no folder of real launchers")
@pytest.mark.parametrize("real", REAL, ids=lambda p: p.stem)
def test_real_launcher_small_model_error(real, targets, capsys):
    assert launch.main(["--launcher", str(real), str(targets["hybrid-4"]), "--dry-run"]) == 2
    assert "layer ids [2, 2, 1, 4]" in capsys.readouterr().err


GENERATION = {"0.5.0": "0.5", "0.6.x": "0.6", "0.7.x": "0.7+", "main": "0.7+"}


@pytest.mark.skipif(not REAL, reason="SPECULATORS_LAUNCHERS names no folder of real launchers")
@pytest.mark.parametrize("real", REAL, ids=lambda p: p.stem)
def test_real_launchers_generation_is_told_as_its_doubles(real, targets):
    from speculators_hybrid.launcher import adjust

    argv = [str(targets["hybrid-text"])]
    assert (
        adjust.launcher_generation(intercept.capture(str(real), argv), argv)
        == (GENERATION[release(real)])
    )
