"""`speculators-hybrid accept`: its input checks (one line, exit 2, before any engine starts),
the drafter's method read from its config, one engine process a run with the options passed on,
the table of the drafter's rates against the target's, and an engine that fails named with its
log and the root cause read from that log. The engines here are a stand-in script (no GPU on
this machine); the engine itself runs on the GPU in benchmarks/acceptance/loop.sh. vLLM is
needed (the command checks for it), so this runs in the envs of support.CLI.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from speculators_hybrid import cli
from speculators_hybrid.accept import command
from speculators_hybrid.accept.engine import opening

pytest.importorskip("vllm")

# answers as speculators_hybrid.accept.engine does: TARGET HELDOUT OUT [--drafter DIR ...]
STANDIN = r"""
import json, os, sys
out, args = sys.argv[3], sys.argv[4:]
with open(os.environ["STANDIN_ARGS"], "a") as f:
    f.write(json.dumps(args) + "\n")
if "--drafter" in args:
    if os.environ.get("STANDIN_FAIL"):
        # vLLM's engine core logs the root cause; the front end raises a generic error
        print("(EngineCore pid=7) ValueError: draft models do not support M-RoPE yet")
        print("Traceback (most recent call last):")
        error = "RuntimeError: Engine core initialization failed. See root cause above."
        json.dump({"error": error}, open(out, "w"))
        sys.exit(1)
    report = {"acceptance_per_position": [0.5, 0.25, 0.125], "acceptance_length": 1.875,
              "batch_tok_s": 2000.0, "serial_tok_s": 120.0,
              "past_end_share": 0.0 if "--stop-at-end" in args else 0.3}
else:
    report = {"acceptance_per_position": [], "acceptance_length": None,
              "batch_tok_s": 4000.0, "serial_tok_s": 80.0}
json.dump(report, open(out, "w"))
"""


@pytest.fixture
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text("{}")
    heldout = tmp_path / "heldout.jsonl"
    chat = {"conversations": [{"role": "user", "content": "def f():"}, {"role": "assistant"}]}
    heldout.write_text(json.dumps(chat) + "\n\n" + json.dumps(chat) + "\n")
    run = tmp_path / "train-dflash"
    for step in ("0", "4", "10", "checkpoint_best"):
        (run / step).mkdir(parents=True)
        (run / step / "config.json").write_text(json.dumps({"speculators_model_type": "dflash"}))
    standin = tmp_path / "standin.py"
    standin.write_text(STANDIN)
    monkeypatch.setattr(command, "ENGINE", [sys.executable, str(standin)])
    monkeypatch.setenv("STANDIN_ARGS", str(tmp_path / "args.jsonl"))
    return {"target": target, "heldout": heldout, "run": run, "tmp": tmp_path}


def accept(s: dict[str, Path], *extra: str) -> int:
    args = ["accept", str(s["target"]), str(s["heldout"]), "--out", str(s["tmp"] / "out")]
    return cli.main([*args, *extra])


def test_the_drafter_against_the_target_alone(setup, capsys) -> None:
    assert accept(setup, "--drafter", str(setup["run"] / "10"), "--eager", "--k", "3") == 0
    out = capsys.readouterr().out
    drafter_row = next(line for line in out.splitlines() if line.startswith("drafter "))
    assert drafter_row.split()[1:5] == ["0.500", "0.250", "0.125", "1.88"]
    assert "2,000 (0.50x)" in out and "120.0 (1.50x)" in out  # against 4,000 / 80.0
    calls = [json.loads(line) for line in (setup["tmp"] / "args.jsonl").read_text().splitlines()]
    assert len(calls) == 2 and "--drafter" not in calls[0]  # the target alone first
    assert calls[1][calls[1].index("--method") + 1] == "dflash"  # from the drafter's config
    assert all("--eager" in c and c[c.index("--k") + 1] == "3" for c in calls)
    report = json.loads((setup["tmp"] / "out" / "report.json").read_text())
    assert report["method"] == "dflash" and set(report["runs"]) == {"target", "drafter"}
    # a second run does not overwrite the first one's report
    assert accept(setup, "--drafter", str(setup["run"] / "10")) == 2
    assert "already holds a report" in capsys.readouterr().err


def test_an_engine_that_fails_is_named_with_its_log(setup, capsys, monkeypatch) -> None:
    monkeypatch.setenv("STANDIN_FAIL", "1")
    assert accept(setup, "--drafter", str(setup["run"] / "4"), "--no-baseline") == 1
    out = capsys.readouterr().out
    assert "the engine failed: (EngineCore pid=7) ValueError: draft models do not support" in out
    assert str(setup["tmp"] / "out" / "drafter.log") in out
    calls = (setup["tmp"] / "args.jsonl").read_text().splitlines()
    assert len(calls) == 1  # --no-baseline: no target-alone engine


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("several-checkpoints", "holds 4 checkpoints (0, 4, 10, checkpoint_best): name one, e.g. "),
        ("no-target", "does not exist: give the target model's folder"),
        ("bad-heldout", "line 2 is not one of speculators' chats"),
        ("unknown-type", "names no drafter type this command knows (speculators_model_type: 'x')"),
        ("zero-k", "'0' is not a whole number above 0"),
        ("memory", "'1.5' is not a fraction in (0, 1]"),
    ],
)
def test_bad_input_is_one_line_before_any_engine(setup, capsys, case: str, expected: str) -> None:
    drafter = setup["run"] / "4"
    args = ["--drafter", str(drafter)]
    if case == "several-checkpoints":
        args = ["--drafter", str(setup["run"])]
    elif case == "no-target":
        setup["target"] = setup["tmp"] / "missing"
    elif case == "bad-heldout":
        setup["heldout"].write_text('{"conversations": [{"role": "user", "content": "x"}]}\n[]\n')
    elif case == "unknown-type":
        (drafter / "config.json").write_text(json.dumps({"speculators_model_type": "x"}))
    elif case == "zero-k":
        args += ["--k", "0"]
    elif case == "memory":
        args += ["--gpu-memory-utilization", "1.5"]
    try:
        rc = accept(setup, *args)
    except SystemExit as exc:  # argparse's own usage error
        rc = int(exc.code or 0)
    err = capsys.readouterr().err
    assert rc == 2 and expected in err, err
    if case == "several-checkpoints":
        assert err.strip().endswith(f"--drafter {setup['run']}/10")  # the last, by number
    if case not in ("zero-k", "memory"):  # argparse's own: usage, then the one-line reason
        assert err.count("\n") == 1
    assert not (setup["tmp"] / "args.jsonl").exists()  # no engine started


def test_the_prompt_is_the_chat_up_to_the_first_assistant_turn() -> None:
    sharegpt = [
        {"from": "system", "value": "Be brief."},
        {"from": "human", "value": "def f():"},
        {"from": "gpt", "value": "    return 1"},
        {"from": "human", "value": "again"},
    ]
    assert opening(sharegpt) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "def f():"},
    ]
    assert opening([{"role": "assistant", "content": "hi"}]) == []


def test_tokens_after_the_replies_end_are_named(setup, capsys) -> None:
    """Fixed-length replies that ran past their end-of-turn token get a line; --stop-at-end
    reaches the engines and the line goes."""
    drafter = ["--drafter", str(setup["run"] / "10")]
    assert accept(setup, *drafter) == 0
    assert "accept: 30% of the tokens came after a reply's end-of-turn token" in (
        capsys.readouterr().out
    )
    (setup["tmp"] / "out" / "report.json").unlink()
    assert accept(setup, *drafter, "--stop-at-end") == 0
    assert "end-of-turn" not in capsys.readouterr().out
    calls = [json.loads(line) for line in (setup["tmp"] / "args.jsonl").read_text().splitlines()]
    assert ["--stop-at-end" in c for c in calls] == [False, False, True, True]
