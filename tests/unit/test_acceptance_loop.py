"""benchmarks/acceptance/loop.sh's order of phases, with a stand-in for the staged environment.

The loop runs on the GPU machine, where a wait that never returns costs the session's device
time; here each command it runs is answered by a small script (RUNNER): the target, a server that
answers /health until it is stopped, prepare-data, the trainers, the accept engine. The loop
must end on its own, stop the server, train the ablation with the verifier-norm patch off, and
serve DFlash from a 1-D copy only when the as-trained one fails; with REFERENCE=1 (the default),
write the reference states after prepare-data and train two more EAGLE-3s offline from them (the
shuffled-states control once the online trainers are done), and read the trainers' validation.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest
import standin_vllm

LOOP = Path(__file__).resolve().parents[2] / "benchmarks" / "acceptance" / "loop.sh"

RUNNER = (
    standin_vllm.RUNNER_HEAD
    + r"""# answers the loop's commands
case $args in
  *target.py*)
    mkdir -p "$3"; echo '{"heldout_loss": 1.0}' > "$3/target.json"
    for i in 1 2 3; do echo '{"conversations": []}'; done > "$3/chats.jsonl"
    cp "$3/chats.jsonl" "$3/heldout.jsonl" ;;
  *"speculators_hybrid.cli launch"*)
    port=$(value --port "$@")
    echo "$$ $(value --hidden-states-backend "$@")" >> "$STUB/servers"
    [ -n "${FP8_FAILS:-}" ] && [ "$(value --hidden-states-backend "$@")" = fp8 ] && exit 1
    exec python3 "$STANDIN" "$port" ;;
  *"api_server --model"*)  # REGEN's plain server
    echo "$$ plain" >> "$STUB/servers"; exec python3 "$STANDIN" "$(value --port "$@")" ;;
  *regenerate-responses*)  # the plain server must answer; REGEN_FAILS: it fails
    [ -n "${REGEN_FAILS:-}" ] && exit 3
    endpoint=$(value --endpoint "$@")
    python3 -c "import urllib.request as u; u.urlopen('${endpoint%/v1/*}/health')" || exit 4
    echo '{"input_ids": [1], "loss_mask": [1]}' > "$(value --outfile "$@")" ;;
  *prepare-data*)
    out=$(value --output "$@"); mkdir -p "$out"; value --data "$@" > "$out/from" ;;
  *compileall*) touch "$STUB/compiled" ;;
  *importtime*)  # only once the staged packages are compiled
    [ -f "$STUB/compiled" ] && echo "import time: 1 | 2 | vllm" >&2 ;;
  *hf_states.py*)  # TARGET DATA OUT: after prepare-data
    [ -d "$4" ] || { echo "stub: no prepared data at $4" >&2; exit 1; }
    mkdir -p "$5" "$(value --shuffled-copy "$@")"; echo '{}' > "$(value --report "$@")" ;;
  *mtp_head.py*) touch "$3/mtp-head" ;;  # TARGET
  *stitch-mtp*)  # CHECKPOINT TARGET --output-path OUT
    out=$(value --output-path "$@"); mkdir -p "$out"
    printf '{"checkpoint": "%s", "into": "%s"}' "$5" "$6" > "$out/config.json" ;;
  *"speculators train"*)
    save=$(value --save-path "$@"); mkdir -p "$save/1"
    [ -n "$(value --vllm-endpoint "$@")" ] && sleep 3  # online: the server's samples take a while
    alive=""  # whether a training server still runs while this trainer starts
    while read -r pid _; do kill -0 "$pid" 2> /dev/null && alive=1; done < "$STUB/servers"
    fmt='{"off": "%s", "seed": "%s", "full": "%s", "from": "%s %s %s", "backend": "%s",'
    fmt+=' "rope_parameters": %s, "alive": "%s", "kind": "%s", "head": "%s", "data": "%s"}'
    head=""; [ -f "$(value --verifier-name-or-path "$@")/mtp-head" ] && head=1
    printf "$fmt" \
      "${SPECULATORS_HYBRID_DISABLED_PATCHES:-}" "$(value --seed "$@")" \
      "$(value --full-attention-indices "$@")" \
      "$(value --on-missing "$@")" \
      "$(value --hidden-states-path "$@")" "$(value --vllm-endpoint "$@")" \
      "$(value --hidden-states-backend "$@")" '{"mrope_section": [1, 1]}' "$alive" \
      "$(value --speculator-type "$@")" "$head" "$(value --data-path "$@")" \
      > "$save/1/config.json" ;;
  *"speculators_hybrid.cli accept"*)  # the user's command, served alone: as-trained DFlash refused
    out=$(value --out "$@"); mkdir -p "$out"; echo "$args" > "$out/args"
    [ -n "${CLI_BROKEN:-}" ] && { echo "accept: error: the command itself" >&2; exit 2; }
    echo "ValueError: draft models do not support M-RoPE yet" | tee "$out/drafter.log" >&2
    echo '{"error": "ValueError: draft models do not support M-RoPE yet", "via": "cli"}' \
      > "$out/drafter.json"
    exit 1 ;;
  *accept.engine*)
    out="${!#}"
    case $out in *accept-dflash.json)  # the as-trained DFlash: refused, as stock vLLM does
      echo "ValueError: draft models do not support M-RoPE yet" >&2
      echo '{"error": "ValueError: draft models do not support M-RoPE yet"}' > "$out"; exit 1;; esac
    fmt='{"args": "%s", "off": "%s", "disabled": "%s"}'
    off=${SPECULATORS_HYBRID_DISABLE:-} disabled=${SPECULATORS_HYBRID_DISABLED_PATCHES:-}
    printf "$fmt" "$args" "$off" "$disabled" > "$out" ;;
  *) echo "stub: unexpected: $args" >&2; exit 9 ;;
esac
"""
)


def free_port() -> int:
    """A free port whose next one is free too (the fp8 server's)."""
    while True:
        with socket.socket() as s, socket.socket() as t:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
            try:
                t.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port


def run_loop(tmp_path: Path, knobs: dict[str, str]) -> tuple[Path, str, dict[str, str]]:
    """loop.sh all with the stand-in RUNNER and these knobs: the loop's folder, its status and
    the servers it started (pid: backend); fails if it did not end on its own or left a server."""
    acc, stub = tmp_path / "acc", tmp_path / "stub"
    for d in (acc / "code", acc / "logs", acc / "results", stub):
        d.mkdir(parents=True)
    runner = stub / "runner.sh"
    runner.write_text(RUNNER)
    env = {**os.environ, "ACC": str(acc), "RUNNER": str(runner), "STUB": str(stub)}
    env["STANDIN"] = str(Path(standin_vllm.__file__))
    env |= {"PORT": str(free_port()), "TARGET_S": "1", "CHATS": "2", "STEPS": "1", **knobs}
    left_running = False
    try:
        done = subprocess.run(
            ["bash", str(LOOP), "all"], env=env, capture_output=True, text=True, timeout=60
        )
    finally:  # a loop that hangs leaves its servers: stop them here too
        servers = dict(line.split(" ", 1) for line in (stub / "servers").read_text().splitlines())
        for pid in servers:
            left_running |= Path(f"/proc/{pid}/cmdline").exists()
            subprocess.run(["kill", "--", f"-{pid}"], capture_output=True)
    status = (acc / "status").read_text()
    assert done.returncode == 0, status + done.stderr
    assert "loop: finished" in status, status
    assert not left_running, "the loop left a training server running"
    return acc, status, servers


@pytest.mark.parametrize(
    ("reference", "graphs", "fp8", "few"),
    [("1", "1", "0", "0"), ("0", "0", "1", "0"), ("0", "0", "fails", "0"), ("1", "0", "0", "1")],
)
def test_loop_ends_stops_its_server_and_runs_every_phase(
    tmp_path: Path, reference: str, graphs: str, fp8: str, few: str
) -> None:
    """few=1: ABLATE=0 NOISE=0, four trainers: the control trains beside the online ones."""
    env = {"REFERENCE": reference, "GRAPHS": graphs, "FP8": "0" if fp8 == "0" else "1"}
    env["PORT"] = str(free_port())
    full = ("dflash-full",) if reference == "1" and few == "0" else ()  # DFLASH_FULL: default 0
    nonorm = () if few == "1" else ("eagle3-nonorm",)  # ABLATE: default 1
    seed1 = () if few == "1" else ("eagle3-seed1",)  # NOISE: default 1
    if few == "1":
        env |= {"ABLATE": "0", "NOISE": "0"}
    if full:
        env["DFLASH_FULL"] = "1"
    if fp8 == "fails":  # the fp8 server dies at start: the loop goes on without eagle3-fp8
        env |= {"FP8_FAILS": "1", "PARALLEL": "all"}  # and every engine is served at once
    if fp8 == "1":  # `speculators-hybrid accept` itself fails: DFlash is served by the engine
        env["CLI_BROKEN"] = "1"
    acc, status, servers = run_loop(tmp_path, env)
    assert "imports: compiled in" in status and "imports: done in" in status
    assert "vllm" in (acc / "logs" / "imports.log").read_text()
    assert sorted(servers.values()) == ([""] if fp8 == "0" else ["", "fp8"])
    assert ("server fp8: FAILED" in status) == (fp8 == "fails")
    assert ("train eagle3-nonorm: exit 0" in status) == bool(nonorm)

    offline = ("eagle3-hf32", "eagle3-shuffled") if reference == "1" else ()
    from_fp8 = ("eagle3-fp8",) if fp8 == "1" else ()
    configs = {
        name: json.loads(path.read_text())
        for name in (
            "eagle3",
            "dflash",
            "dflash-full",
            "eagle3-nonorm",
            "eagle3-seed1",
            *offline,
            *from_fp8,
        )
        if (path := acc / f"train-{name}" / "1" / "config.json").exists()
    }
    assert {name: c["off"] for name, c in configs.items()} == {
        "eagle3": "",
        "dflash": "",
        **{name: "verifier-norm-eagle3" for name in nonorm},
        **{name: "" for name in (*full, *seed1, *offline, *from_fp8)},
    }
    assert {name: c["full"] for name, c in configs.items()} == {
        name: "0" if name == "dflash-full" else "" for name in configs
    }
    assert {name: c["seed"] for name, c in configs.items()} == {
        name: "1" if name == "eagle3-seed1" else "0" for name in configs
    }
    if from_fp8:  # the second server's fp8 files, read as fp8
        fp8_server = f"generate  http://127.0.0.1:{int(env['PORT']) + 1}/v1"
        assert configs["eagle3-fp8"]["from"] == fp8_server
        assert configs["eagle3-fp8"]["backend"] == "fp8" and configs["eagle3"]["backend"] == ""
    online = f"generate  http://127.0.0.1:{env['PORT']}/v1"
    assert {configs[n]["from"] for n in ("eagle3", "dflash", *nonorm, *seed1)} == {online}
    if offline:  # from the reference folders, never from the server
        assert configs["eagle3-hf32"]["from"] == f"raise {acc}/hs-hf32 "
        assert configs["eagle3-shuffled"]["from"] == f"raise {acc}/hs-shuffled "
        assert status.index("prepare-data: done") < status.index("hf-states: computing")
        assert status.index("hf-states: done") < status.index("train eagle3-hf32: exit 0")
        assert (acc / "results" / "hf_states.json").exists()
        # the control trains once the online trainers are done and their server stopped, or
        # beside them where only four trainers are planned
        assert configs["eagle3-shuffled"]["alive"] == ("1" if few == "1" else "")
        assert configs["eagle3"]["alive"] == "1"
    validated = json.loads((acc / "results" / "train-validation.json").read_text())
    assert set(validated) == set(configs)  # one entry per trainer log

    results = {p.name for p in (acc / "results").glob("accept-*.json")}
    assert results == {
        f"accept-{n}.json"
        for n in (
            "target",
            "eagle3",
            "dflash",  # its error
            "dflash-1d",
            *full,
            "dflash-noncausal",
            *nonorm,
            *seed1,
            *offline,
            *from_fp8,
            "eagle3-stock",
            "eagle3-stop",
            "dflash-stop",
            *(("target-graphs", "eagle3-graphs") if graphs == "1" else ()),
        )
    }, results
    side_by_side = (acc / "results" / "parallel.txt").read_text().split()
    assert "eagle3-stock" in side_by_side
    assert ("eagle3" in side_by_side) == (fp8 == "fails")  # else timed alone
    for name in ("eagle3-stop", "dflash-stop"):  # the replies alone, beside the others
        stop = json.loads((acc / "results" / f"accept-{name}.json").read_text())["args"]
        assert "--stop-at-end" in stop and name in side_by_side
    stop = json.loads((acc / "results" / "accept-eagle3-stop.json").read_text())["args"]
    assert "train-eagle3/1 --method eagle3" in stop
    stock = json.loads((acc / "results" / "accept-eagle3-stock.json").read_text())
    assert "--eager" in stock["args"] and stock["off"] == "1"
    assert "--gpu-memory-utilization 0.1" in stock["args"]  # engines that share the GPU
    noncausal = json.loads((acc / "results" / "accept-dflash-noncausal.json").read_text())
    assert (
        noncausal["disabled"] == "dflash-causal-draft-blocks" and "dflash-noncausal" in side_by_side
    )
    assert "train-dflash/" in noncausal["args"]
    if graphs == "1":
        with_graphs = json.loads((acc / "results" / "accept-eagle3-graphs.json").read_text())
        assert "--eager" not in with_graphs["args"]
    cause = (acc / "results" / "accept-dflash.cause.txt").read_text()
    assert "do not support M-RoPE" in cause  # the stand-in engine's own error, kept
    refused = json.loads((acc / "results" / "accept-dflash.json").read_text())
    assert "M-RoPE" in refused["error"]
    # through the user's command, its method from the config: alone, or beside every engine
    cli = (acc / "cli-dflash" / "args").read_text()
    assert "--no-baseline" in cli and "--method" not in cli and "train-dflash/" in cli
    assert ("via" in refused) == (fp8 != "1")  # else from the engine, after the command failed
    share = "0.1" if fp8 == "fails" else "0.3"
    assert f"--gpu-memory-utilization {share}" in cli
    assert ("dflash" in side_by_side) == (share == "0.1")
    one_d = json.loads((acc / "dflash-1d" / "config.json").read_text())
    assert one_d["rope_parameters"] == {}
    assert (acc / "results" / "train.done").exists() and (acc / "results" / "accept.done").exists()
    knobs = json.loads((acc / "results" / "knobs.json").read_text())
    assert knobs["REFERENCE"] == reference and knobs["STEPS"] == "1"
    assert knobs["ABLATE"] == knobs["NOISE"] == ("0" if few == "1" else "1")
    fp8_planned = ("eagle3-fp8",) if fp8 != "0" else ()  # planned even where its server failed
    assert knobs["drafters"] == [
        "eagle3",
        "dflash",
        *full,
        *nonorm,
        *offline,
        *seed1,
        *fp8_planned,
    ]


def test_start_refuses_a_staged_wheel_without_the_accept_engine(tmp_path: Path) -> None:
    """`start` on a machine whose staged project predates the accept engine: one line, exit 2,
    nothing started (the loop would spend its device time to fail at the first engine)."""
    tree = tmp_path / "tree"
    (tree / "benchmarks").mkdir(parents=True)
    (tree / ".device").mkdir()
    (tree / ".device" / "launch_vllm.py").write_text("")
    subprocess.run(["cp", "-r", str(LOOP.parent), str(tree / "benchmarks")], check=True)
    subprocess.run(["cp", str(LOOP.parents[1] / "stash.sh"), str(tree / "benchmarks")], check=True)
    runner = tmp_path / "runner.sh"
    runner.write_text('echo "$*" >> "$(dirname "$0")/asked"; exit 1\n')  # the import fails
    env = {**os.environ, "ACC": str(tmp_path / "acc"), "RUNNER": str(runner)}
    done = subprocess.run(
        ["bash", "benchmarks/acceptance/loop.sh", "start"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and "stage.sh --project-only" in done.stderr
    assert "import speculators_hybrid.accept.engine" in (tmp_path / "asked").read_text()
    assert not (tmp_path / "acc" / "status").exists()  # the loop never started


def test_the_staged_folders_are_compiled_without_importing_them(tmp_path: Path) -> None:
    """stash.sh's STASH_COMPILE (the first step of every GPU job), run by the real compileall:
    the two folders on PYTHONPATH (the staged vLLM's and torch's, laid out as staged) get the
    bytecode of every module, a folder not on it (the image's) none, nothing is imported, and a
    file that does not compile leaves the rest compiled."""
    text = (LOOP.parents[1] / "stash.sh").read_text()
    start = text.index("STASH_COMPILE='") + len("STASH_COMPILE='")
    snippet = text[start : text.index("'", start)]
    site, torch_site, image = tmp_path / "site", tmp_path / "torch-site", tmp_path / "image"
    for name in ("vllm/__init__.py", "vllm/entrypoints/api.py", "transformers/models.py"):
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text("x = 1\n")
    (site / "vllm" / "__init__.py").write_text("raise SystemExit('vllm imported')\n")
    (site / "broken.py").write_text("def (:\n")
    for folder in (torch_site, image):
        (folder / "torch").mkdir(parents=True)
        (folder / "torch" / "__init__.py").write_text("raise SystemExit('torch imported')\n")
    path = os.pathsep.join((str(site), str(torch_site), str(tmp_path / "missing")))
    done = subprocess.run(
        ["python3", "-c", snippet],
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    compiled = {p.parent.parent.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.pyc")}
    staged = {"site/vllm", "site/vllm/entrypoints", "site/transformers", "torch-site/torch"}
    assert compiled == staged, compiled
    names = {p.name.split(".")[0] for p in site.rglob("*.pyc")}
    assert names == {"__init__", "api", "models"}, names  # broken.py: skipped


def test_mtp_heads_finetunes_stitches_and_serves_the_native_head(tmp_path: Path) -> None:
    """MTP=1: the head is added before the server starts; mtp and mtp-nonorm (the plugin's
    mtp-final-norm off) finetune it; each checkpoint is stitched into a copy of the target, which
    the engine serves as target and drafter with vLLM's MTP; the untrained head is the control."""
    knobs = {"MTP": "1", "REFERENCE": "0", "ABLATE": "0", "NOISE": "0", "PARALLEL": "all"}
    acc, status, _ = run_loop(tmp_path, knobs)
    assert status.index("mtp head: added") < status.index("server: starting")
    trained = {
        name: json.loads((acc / f"train-{name}" / "1" / "config.json").read_text())
        for name in ("mtp", "mtp-nonorm", "eagle3")
    }
    assert {n: (c["kind"], c["off"], c["head"]) for n, c in trained.items()} == {
        "mtp": ("mtp", "", "1"),
        "mtp-nonorm": ("mtp", "mtp-final-norm", "1"),
        "eagle3": ("eagle3", "", "1"),
    }
    for name in ("mtp", "mtp-nonorm"):
        assert f"stitch {name}: exit 0" in status
        stitched = acc / f"stitched-{name}"
        made = json.loads((stitched / "config.json").read_text())
        assert made == {"checkpoint": str(acc / f"train-{name}" / "1"), "into": str(acc / "target")}
        served = json.loads((acc / "results" / f"accept-{name}.json").read_text())["args"]
        assert f"--drafter {stitched} --method mtp --k 3 {stitched} " in served
    control = json.loads((acc / "results" / "accept-mtp-random.json").read_text())["args"]
    assert f"--drafter {acc / 'target'} --method mtp" in control
    side_by_side = (acc / "results" / "parallel.txt").read_text().split()
    assert {"mtp", "mtp-nonorm", "mtp-random"} <= set(side_by_side)
    planned = json.loads((acc / "results" / "knobs.json").read_text())["drafters"]
    assert planned == ["eagle3", "dflash", "mtp", "mtp-nonorm"]


@pytest.mark.parametrize("fails", [False, True])
def test_regen_trains_eagle3_and_dflash_on_the_targets_own_replies(
    tmp_path: Path, fails: bool
) -> None:
    """REGEN=1: a plain server answers the training chats (regenerate-responses), prepare-data
    keeps those rows in data-regen, and eagle3-regen / dflash-regen train on them and are served;
    the plain server is stopped. If regeneration fails, the loop goes on without them."""
    knobs = {"REGEN": "1", "REFERENCE": "0", "ABLATE": "0", "NOISE": "0", "PARALLEL": "all"}
    if fails:
        knobs["REGEN_FAILS"] = "1"
    acc, status, servers = run_loop(tmp_path, knobs)
    assert sorted(servers.values()) == ["", "plain"]
    assert status.index("prepare-data: done") < status.index("regen: exit")
    trained = {
        p.parent.parent.name: json.loads(p.read_text()) for p in acc.glob("train-*/1/config.json")
    }
    regen = {"train-eagle3-regen", "train-dflash-regen"}
    assert set(trained) == {"train-eagle3", "train-dflash"} | (set() if fails else regen)
    for name, config in trained.items():
        assert config["data"] == str(acc / ("data-regen" if name in regen else "data"))
    served = {p.stem[len("accept-") :] for p in (acc / "results").glob("accept-*.json")}
    assert ("eagle3-regen" in served and "dflash-regen" in served) == (not fails)
    if fails:
        assert "regen: exit 3, 0 rows" in status
    else:
        assert "regen: exit 0, 1 rows" in status
        assert (acc / "data-regen" / "from").read_text().strip() == str(acc / "regen.jsonl")
        args = json.loads((acc / "results" / "accept-dflash-regen.json").read_text())["args"]
        assert "train-dflash-regen/1 --method dflash --k 3" in args
    planned = json.loads((acc / "results" / "knobs.json").read_text())["drafters"]
    assert planned == ["eagle3", "dflash", "eagle3-regen", "dflash-regen"]
