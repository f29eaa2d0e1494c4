"""`launch` with each launcher generation's double and with the built-in launcher: the command
it catches, the hybrid adjustments and the dry-run output (in-process, nothing exec'd)."""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "launchers"))
from launch_support import FORCES_NO_CHUNKED, GENERATIONS, models  # noqa: E402

from speculators_hybrid import (
    launch,  # noqa: E402
    switches,  # noqa: E402
)
from speculators_hybrid.extraction import layer_ids_error  # noqa: E402
from speculators_hybrid.launcher import adjust, intercept  # noqa: E402

SOURCES = ["builtin", *GENERATIONS]  # the built-in launcher behaves as main's


def with_launcher(source: str, args: list[str]) -> list[str]:
    return args if source == "builtin" else ["--launcher", str(GENERATIONS[source]), *args]


def added(cmd) -> dict[str, str]:
    """The environment `launch` sets for vLLM beyond its own."""
    return {k: v for k, v in (cmd.env or {}).items() if os.environ.get(k) != v}


def stock(source: str, model: Path, ids: list[int], extra: tuple[str, ...] = ()) -> list[str]:
    """What the stock launcher of `source` execs, written out from the contract."""
    spec = {
        "method": "extract_hidden_states",
        "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": ids}},
    }
    kv = {
        "kv_connector": "ExampleHiddenStatesConnector",
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": "/tmp/hidden_states"},
    }
    argv = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(model)]
    argv += ["--speculative_config", json.dumps(spec), "--kv_transfer_config", json.dumps(kv)]
    argv += list(extra)
    if source in FORCES_NO_CHUNKED and "--no-enable-chunked-prefill" not in argv:
        argv.append("--no-enable-chunked-prefill")
    return argv


@pytest.fixture(scope="module")
def targets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return models(tmp_path_factory.mktemp("models"))


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    monkeypatch.delenv("SPECULATORS_HYBRID_DISABLE", raising=False)
    monkeypatch.delenv(switches.PREFILL_ONLY, raising=False)
    vllm("0.33.0", monkeypatch)  # the same answers whichever vLLM this env has


def vllm(version: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch, "installed", lambda dist: version if dist == "vllm" else None)


@pytest.mark.parametrize("source", list(GENERATIONS))
def test_the_double_execs_the_documented_command(source, targets, capsys):
    model = targets["plain"]
    cmd = intercept.capture(str(GENERATIONS[source]), [str(model), "--", "--max-model-len", "64"])
    assert cmd.argv == stock(source, model, [2, 4, 5, 8], ["--max-model-len", "64"])
    assert (cmd.file, cmd.env, cmd.search_path) == (sys.executable, None, True)
    assert "Running command:" not in capsys.readouterr().out  # ours is printed instead


@pytest.mark.parametrize("source", SOURCES)
def test_plain_target_gets_the_stock_command(source, targets, monkeypatch):
    monkeypatch.setenv("VLLM_PLUGINS", "other")
    model = targets["plain"]
    cmd, dry = launch.plan(with_launcher(source, [str(model), "--", "--enforce-eager"]))
    expected = "main" if source == "builtin" else source
    assert cmd.argv == stock(expected, model, [2, 4, 5, 8], ["--enforce-eager"])
    assert cmd.env is None and not dry


@pytest.mark.parametrize("source", SOURCES)
def test_hybrid_text_target(source, targets, capsys):
    model = targets["hybrid-text"]
    cmd, _ = launch.plan(with_launcher(source, [str(model), "--", "--enforce-eager"]))
    assert cmd.argv == stock("main", model, [2, 4, 5, 8], ["--enforce-eager"])
    assert "--language-model-only" not in cmd.argv
    assert added(cmd) == {switches.PREFILL_ONLY: "1"}  # prefill-only: a hybrid's default
    err = capsys.readouterr().err
    assert ("removed --no-enable-chunked-prefill" in err) == (source in FORCES_NO_CHUNKED)


@pytest.mark.parametrize("source", SOURCES)
def test_hybrid_multimodal_target_is_language_model_only(source, targets, capsys):
    model = targets["hybrid-mm"]
    cmd, _ = launch.plan(with_launcher(source, [str(model)]))
    # ids from text_config's 8 layers; the forced flag gone; the vision tower not built
    assert cmd.argv == stock("main", model, [2, 4, 5, 8]) + ["--language-model-only"]
    assert "vision tower is not built" in capsys.readouterr().err


@pytest.mark.parametrize("source", SOURCES)
def test_explicit_choices_of_the_user_are_kept(source, targets):
    model = targets["hybrid-mm"]
    extra = ["--no-enable-chunked-prefill", "--no-language-model-only"]
    cmd, _ = launch.plan(with_launcher(source, [str(model), "--", *extra]))
    assert cmd.argv == stock("main", model, [2, 4, 5, 8], extra)


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize(
    ("plugins", "expected"),
    [
        (None, None),
        ("", "speculators_hybrid"),
        ("a,b", "a,b,speculators_hybrid"),
        ("a,speculators_hybrid", None),
    ],
)
def test_plugin_allow_list_includes_ours(source, plugins, expected, targets, monkeypatch):
    if plugins is not None:
        monkeypatch.setenv("VLLM_PLUGINS", plugins)
    cmd, _ = launch.plan(with_launcher(source, [str(targets["hybrid-text"])]))
    assert added(cmd).get("VLLM_PLUGINS") == expected


@pytest.mark.parametrize("source", SOURCES)
def test_default_ids_that_collide_are_an_error_with_advice(source, targets, capsys):
    assert launch.main(with_launcher(source, [str(targets["hybrid-4"]), "--dry-run"])) == 2
    captured = capsys.readouterr()
    assert "Running command:" not in captured.out
    err = captured.err
    assert "layer ids [2, 2, 1, 4]" in err and "n = 4" in err and "duplicated [2]" in err
    assert "--target-layer-ids 1 2 3" in err and "Traceback" not in err


@pytest.mark.parametrize("source", SOURCES)
def test_ids_out_of_range_are_an_error(source, targets, capsys):
    args = [str(targets["hybrid-text"]), "--target-layer-ids", "3", "9"]
    assert launch.main(with_launcher(source, [*args, "--dry-run"])) == 2
    assert "outside [0, 8]: [9]" in capsys.readouterr().err


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("name", ["hybrid-text", "plain"])
def test_bad_ids_stop_before_exec_with_the_vllm_side_message(source, name, targets, capsys):
    args = [str(targets[name]), "--target-layer-ids", "3", "3", "9", "--dry-run"]
    assert launch.main(with_launcher(source, args)) == 2
    captured = capsys.readouterr()
    assert "Running command:" not in captured.out
    # The message vLLM itself gives with our plugin (vllm_patches/extraction_input.py).
    ids = [3, 3, 8, 9] if source == "builtin" else [3, 3, 9, 8]  # the built-in sorts them
    message = layer_ids_error(ids, 8, str(targets[name]), False)
    assert captured.err.strip() == f"speculators-hybrid launch: error: {message}"
    assert "duplicated [3]; outside [0, 8]: [9]" in captured.err


@pytest.mark.parametrize("source", SOURCES)
def test_distinct_custom_ids_fix_a_small_model(source, targets):
    args = [str(targets["hybrid-4"]), "--target-layer-ids", "1", "2", "3"]
    cmd, _ = launch.plan(with_launcher(source, args))
    assert cmd.layer_ids() == [1, 2, 3, 4]


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("name", ["hybrid-mm", "hybrid-text", "plain"])
@pytest.mark.parametrize("flag", ["--dry-run", "--dry"])
def test_dry_run_prints_the_final_command_only(source, name, flag, targets, capsys):
    model = targets[name]
    assert launch.main(with_launcher(source, [str(model), flag, "--", "--port", "8001"])) == 0
    out = capsys.readouterr().out
    expected = stock(
        "main" if source == "builtin" or name != "plain" else source,
        model,
        [2, 4, 5, 8],
        ["--port", "8001"],
    )
    if name == "hybrid-mm":
        expected.append("--language-model-only")
    if name != "plain":  # the environment launch gives vLLM, as `env NAME=VALUE` words
        expected = ["env", f"{switches.PREFILL_ONLY}=1", *expected]
    assert out == f"{launch.DRY_RUN_BANNER}\n{shlex.join(expected)}\n"


def test_dry_run_output_of_a_hybrid_multimodal_target(targets, capsys):
    model = targets["hybrid-mm"]
    launch.main(["--launcher", str(GENERATIONS["0.7.x"]), str(model), "--dry-run"])
    out, err = capsys.readouterr()
    assert out.splitlines()[1].endswith(
        f'serve {model} --speculative_config \'{{"method": "extract_hidden_states", '
        '"num_speculative_tokens": 1, "draft_model_config": {"hf_config": '
        '{"eagle_aux_hidden_state_layer_ids": [2, 4, 5, 8]}}}\' --kv_transfer_config '
        '\'{"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer", '
        '"kv_connector_extra_config": {"shared_storage_path": "/tmp/hidden_states"}}\' '
        "--language-model-only"
    )
    assert "removed --no-enable-chunked-prefill" in err and "extracts with chunked prefill" in err


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("version", ["0.22.0", "0.23.0"])
def test_vllm_022_023_keep_chunked_prefill_off_without_the_plugin(
    source, version, targets, monkeypatch
):
    """There the stock connector refuses chunked prefill, whatever the launcher."""
    vllm(version, monkeypatch)
    monkeypatch.setenv("SPECULATORS_HYBRID_DISABLE", "1")
    model = targets["hybrid-text"]
    cmd, _ = launch.plan(with_launcher(source, [str(model)]))
    assert cmd.argv == stock("main", model, [2, 4, 5, 8]) + ["--no-enable-chunked-prefill"]
    plain, _ = launch.plan(with_launcher(source, [str(targets["plain"])]))
    expected = "main" if source == "builtin" else source
    assert plain.argv == stock(expected, targets["plain"], [2, 4, 5, 8])  # stock, as always


@pytest.mark.parametrize(
    "version", ["0.20.1", "0.21.0", "0.22.0", "0.23.0", "0.24.0", "0.25.0", "0.33.0", None]
)
def test_with_the_plugin_every_release_drops_the_forced_flag(version, targets, monkeypatch):
    """On 0.22-0.23 our connector takes chunked prompts (hidden-states-chunked-prompts)."""
    vllm(version, monkeypatch)
    monkeypatch.setattr(adjust, "_plugin_checks", lambda log: True)  # installed, not disabled
    model = targets["hybrid-text"]
    cmd, _ = launch.plan(["--launcher", str(GENERATIONS["0.6.x"]), str(model)])
    assert cmd.argv == stock("main", model, [2, 4, 5, 8])


def test_vllm_before_020_gets_no_language_model_only(targets, monkeypatch, capsys):
    vllm("0.19.1", monkeypatch)
    cmd, _ = launch.plan([str(targets["hybrid-mm"])])
    assert "--language-model-only" not in cmd.argv
    err = capsys.readouterr().err
    assert "vLLM 0.19.1 lacks it" in err
    assert (
        "vLLM 0.19.1 is older than 0.20.0, the oldest release speculators-hybrid is tested" in err
    )


def test_the_oldest_tested_release_gets_no_age_warning(targets, monkeypatch, capsys):
    vllm("0.20.0", monkeypatch)
    launch.plan([str(targets["hybrid-mm"])])
    assert "older than" not in capsys.readouterr().err


KNOWN_PROBLEMS = [  # (vLLM, vLLM args, the warning without the plugin, the note with it)
    ("0.24.0", [], "all-zero hidden states", "hidden-states-read-slots keeps"),
    # The plugin keeps an explicit --enable-prefix-caching from 0.22 (issue 17), with a word.
    ("0.25.0", ["--enable-prefix-caching"], "hash_block_size", "the plugin keeps it on"),
    (
        "0.22.1",
        ["--enable-prefix-caching"],
        "cannot extract from a hybrid",
        "the plugin keeps it on",
    ),
]


@pytest.mark.parametrize(("version", "args", "warning", "_"), KNOWN_PROBLEMS)
def test_known_vllm_problems_are_warned_about(
    version, args, warning, _, targets, monkeypatch, capsys
):
    vllm(version, monkeypatch)
    monkeypatch.setenv("SPECULATORS_HYBRID_DISABLE", "1")
    launch.plan([str(targets["hybrid-text"]), "--", *args])
    assert warning in capsys.readouterr().err


@pytest.mark.parametrize(("version", "args", "warning", "note"), KNOWN_PROBLEMS)
def test_with_the_plugin_the_note_says_what_it_does(
    version, args, warning, note, targets, monkeypatch, capsys
):
    vllm(version, monkeypatch)
    monkeypatch.setattr(adjust, "_plugin_checks", lambda log: True)  # installed, not disabled
    launch.plan([str(targets["hybrid-text"]), "--", *args])
    err = capsys.readouterr().err
    assert note in err and warning not in err


@pytest.mark.parametrize("version", ["0.25.0", "0.24.0", "0.27.1"])
def test_prefix_caching_for_a_mamba_all_mode_model_is_said_off(
    version, tmp_path, monkeypatch, capsys
):
    """Nemotron-H: vLLM would cache its Mamba state in 'all' mode, where extraction stops the
    engine core up to 0.31 (mamba_all_mode.py): a note that says so."""
    from speculators_hybrid.family_presets import write_family_config

    vllm(version, monkeypatch)
    monkeypatch.setattr(adjust, "_plugin_checks", lambda log: True)
    model = write_family_config(tmp_path / "nemotron", "nemotron-h-8b")
    launch.plan([str(model), "--", "--enable-prefix-caching"])
    err = capsys.readouterr().err
    assert "turns prefix caching off for this model" in err and "the plugin keeps it on" not in err
    launch.plan([str(model), "--", "--enable-prefix-caching", "--mamba-cache-mode", "align"])
    assert "turns prefix caching off" not in capsys.readouterr().err  # the user's 'align' stays


def test_from_0_28_only_an_explicit_all_mode_is_said_off(tmp_path, monkeypatch, capsys):
    """vLLM 0.28-0.31 cache in 'align' mode by default; 'all' asked for still asserts."""
    from speculators_hybrid.family_presets import write_family_config

    vllm("0.31.0", monkeypatch)
    monkeypatch.setattr(adjust, "_plugin_checks", lambda log: True)
    model = write_family_config(tmp_path / "nemotron", "nemotron-h-8b")
    launch.plan([str(model), "--", "--enable-prefix-caching"])
    err = capsys.readouterr().err
    assert "turns prefix caching off" not in err and "the plugin keeps it on" in err
    launch.plan([str(model), "--", "--enable-prefix-caching", "--mamba-cache-mode", "all"])
    assert "turns prefix caching off for this model" in capsys.readouterr().err


@pytest.mark.parametrize("version", ["0.22.1", "0.23.0"])
def test_prefix_caching_without_chunked_prefill_on_0_22_is_said_off(
    version, targets, monkeypatch, capsys
):
    """vLLM 0.22-0.23: the user's --no-enable-chunked-prefill keeps vLLM's connector, which
    refuses the chunked prefill a hybrid model's caching needs (prefix_caching.py)."""
    vllm(version, monkeypatch)
    monkeypatch.setattr(adjust, "_plugin_checks", lambda log: True)
    args = ["--enable-prefix-caching", "--no-enable-chunked-prefill"]
    launch.plan([str(targets["hybrid-text"]), "--", *args])
    err = capsys.readouterr().err
    assert "turns prefix caching off for hybrid extraction" in err
    assert "the plugin keeps it on" not in err


def test_plain_targets_get_no_warnings(targets, monkeypatch, capsys):
    vllm("0.24.0", monkeypatch)
    launch.plan([str(targets["plain"])])
    assert capsys.readouterr().err == ""


def installed_speculators(version: str, monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
    """A real installed-distribution record of speculators, found by importlib.metadata."""
    info = root / f"speculators-{version}.dist-info"
    info.mkdir(parents=True)
    record = f"Metadata-Version: 2.1\nName: speculators\nVersion: {version}\n"
    (info / "METADATA").write_text(record)
    monkeypatch.syspath_prepend(str(root))


@pytest.mark.parametrize(
    ("vllm_version", "speculators", "user", "expected", "said"),
    [
        ("0.20.1", None, None, None, "written off the engine step"),
        ("0.20.1", "0.9.0", None, None, "written off the engine step"),
        ("0.21.0", "0.6.0", None, None, "written off the engine step"),
        ("0.20.1", "0.5.0", None, "0", "speculators 0.5.0 reads hidden-state files without"),
        ("0.20.1", "0.5.0", "1", "1", None),  # the user's own choice stands
        ("0.25.0", "0.5.0", None, None, "upgrade speculators to >= 0.6"),
        ("0.25.0", "0.9.0", None, None, None),  # vLLM's own connector: nothing to choose
    ],
)
def test_files_are_written_where_the_reader_can_see_them(
    vllm_version, speculators, user, expected, said, targets, monkeypatch, tmp_path, capsys
):
    vllm(vllm_version, monkeypatch)
    monkeypatch.delenv(switches.ASYNC_WRITES, raising=False)
    if user is not None:
        monkeypatch.setenv(switches.ASYNC_WRITES, user)
    if speculators is not None:
        installed_speculators(speculators, monkeypatch, tmp_path)
    cmd, _ = launch.plan([str(targets["hybrid-text"])])
    env = cmd.env if cmd.env is not None else dict(os.environ)
    assert env.get(switches.ASYNC_WRITES) == expected
    err = capsys.readouterr().err
    assert (said in err) if said else ("hidden-state files" not in err)


GENERATION = {"0.5.0": "0.5", "0.6.x": "0.6", "0.7.x": "0.7+", "main": "0.7+", "builtin": None}


@pytest.mark.parametrize("source", SOURCES)
def test_a_launchers_generation_is_told_by_its_cli(source, targets):
    model = str(targets["hybrid-text"])
    cmd, _ = launch.plan(with_launcher(source, [model, "--dry-run"]))
    captured = cmd if source == "builtin" else intercept.capture(str(GENERATIONS[source]), [model])
    assert adjust.launcher_generation(captured, [model]) == GENERATION[source]
    # 0.5 and 0.6 look alike where the user passed the flag 0.6 forces
    given = [model, "--", "--no-enable-chunked-prefill"]
    if source in ("0.5.0", "0.6.x"):
        captured = intercept.capture(str(GENERATIONS[source]), list(given))
        assert adjust.launcher_generation(captured, given) is None


@pytest.mark.parametrize(
    ("source", "extra", "speculators", "expected", "said"),
    [
        ("0.5.0", [], None, "0", "speculators 0.5.0 (this launcher's release) reads hidden-state"),
        ("0.5.0", [], "0.9.0", "0", "speculators 0.5.0 (this launcher's release) reads"),
        ("0.6.x", [], None, None, "written off the engine step"),
        ("0.7.x", [], None, None, "written off the engine step"),
        ("main", [], None, None, "written off the engine step"),
        ("builtin", [], None, None, "written off the engine step"),
        # cannot tell 0.5 from 0.6: the line says what to pass
        (
            "0.5.0",
            ["--", "--no-enable-chunked-prefill"],
            None,
            None,
            f"set {switches.ASYNC_WRITES}=0",
        ),
    ],
)
def test_a_050_launcher_gets_in_step_writes_wherever_speculators_is_installed(
    source, extra, speculators, expected, said, targets, monkeypatch, tmp_path, capsys
):
    """The recipe's two virtualenvs: speculators (and its 0.5.0 client) lives in the trainer's,
    not here; speculators' own 0.5.0 launcher tells `launch` which client reads the files."""
    vllm("0.20.1", monkeypatch)
    monkeypatch.delenv(switches.ASYNC_WRITES, raising=False)
    if speculators is not None:
        installed_speculators(speculators, monkeypatch, tmp_path)
    cmd, _ = launch.plan(with_launcher(source, [str(targets["hybrid-text"]), *extra]))
    env = cmd.env if cmd.env is not None else dict(os.environ)
    assert env.get(switches.ASYNC_WRITES) == expected
    assert said in capsys.readouterr().err
