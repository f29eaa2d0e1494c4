"""GPU proof of issue 15: speculators' own pipeline on a hybrid target, end to end.

`speculators-hybrid launch --launcher <speculators' scripts/launch_vllm.py>` (the file named by
`SPECULATORS_HYBRID_LAUNCHER`; the built-in launcher without it) starts `vllm serve` for a tiny
random Qwen3.5 hybrid (multimodal layout, local byte-level tokenizer with a chat template) with
speculators' default layer ids. Then speculators' own commands, as a user runs them:

1. `speculators prepare-data` renders 64 short chat conversations through the server;
2. `speculators generate-offline-data` writes `hs_<i>.safetensors` for them (offline mode), and
   `speculators-hybrid check DIR --dataset DATA` must pass on what it wrote;
3. `speculators train` (through `speculators-hybrid run`, so the verifier-norm patches apply) for
   DFlash and EAGLE-3 with `--on-missing generate` against the same server, on a fixed 16-sample
   subset (4 more rows for speculators' validation split), a few hundred steps (`--epochs`
   sized so the run ends at `--max-steps`): every step's loss finite, the last steps' mean well
   under the first's; no sample dropped (`error_records`), no round-trip retry, every generated file
   read and deleted by the trainer (none left), every request answered 200;
4. the same launch with the plugin off (`SPECULATORS_HYBRID_DISABLE=1`, stock vLLM) must fail at
   server start with the seed's error.

Needs a CUDA GPU, vLLM < 0.22 (our connector) and speculators >= 0.9.0 with hs-connectors
(`tests/gpu/speculators-deps.txt` says how to stage them on the device). Numbers go to
`SPECULATORS_HYBRID_GPU_REPORT` (JSON, e.g. tests/gpu/results/...); logs to
`SPECULATORS_HYBRID_GPU_LOGDIR`, written there as they grow (the server's, each command's, the
trainer's per-step metrics), so a run cut short by the device call's limit still shows where it
was. Time on an H200 (vLLM 0.20.1, 2026-12-02, `stage_seconds` in the JSON): server start 252 s
on a fresh machine (vLLM's kernels built cold), prepare-data 24 s, offline generation 28 s,
check 9 s; DFlash with torch.compile off: 48 s from launch to the first step, then 4.35 steps/s,
200 steps in 94 s; EAGLE-3 with torch.compile off: 47 s, then 2.78 steps/s, 200 steps in 124 s;
the stock start-up check about 60 s. With torch.compile on, 200 DFlash steps did not finish in
the 3.5 minutes left of a 10-minute call (2026-12-01). So `SPECULATORS_HYBRID_PIPELINE_KINDS`
lists the runs of one call, each `dflash` / `eagle3`, or `dflash:eager` for torch.compile off in
that run only (`TORCHDYNAMO_DISABLE=1`, speculators' code unchanged: say so with the numbers;
`..._EAGER=1` for every run), and `SPECULATORS_HYBRID_PIPELINE_BUDGET_S` bounds the whole test:
a run that would pass it is cut, recorded with the steps it reached, its launch-to-first-step
seconds (build, compile, first samples) and its step rate.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("vllm")
speculators = pytest.importorskip("speculators")
from importlib.metadata import version as _version  # noqa: E402

SPECULATORS_VERSION = _version("speculators")  # the package has no __version__
pytest.importorskip("hs_connectors")

import hf_reference as hf  # noqa: E402  (tests/gpu is on sys.path)
from packaging.version import Version  # noqa: E402
from test_hidden_states_match import write_report  # noqa: E402
from test_serve import Server, free_port  # noqa: E402

from speculators_hybrid.models import write_chat_files  # noqa: E402

pytestmark = pytest.mark.gpu

if Version(SPECULATORS_VERSION).release < (0, 9):
    pytest.skip("speculators >= 0.9.0 (prepare-data through /render)", allow_module_level=True)

N_LAYERS = 8  # the tiny preset
IDS = [2, N_LAYERS // 2, N_LAYERS - 3, N_LAYERS]  # speculators' launcher default
CONVERSATIONS, TRAIN_SAMPLES, VAL_SAMPLES = 64, 16, 4
# speculators 0.9.0 wants 0 < --train-data-ratio < 1 (1.0 raises: no validation split), so the
# subset is TRAIN_SAMPLES + VAL_SAMPLES rows split by this ratio (int(20 * 0.8) == 16).
TRAIN_RATIO = TRAIN_SAMPLES / (TRAIN_SAMPLES + VAL_SAMPLES)
# Batches of at most one prepared sample's length (prepare-data's --seq-length): about 8
# batches per epoch of 16 short chats, so few epochs (each one restarts the loader workers
# and runs a validation pass) reach STEPS.
SEQ_LENGTH, SEED = 256, 42
TOTAL_SEQ_LEN = SEQ_LENGTH
STEPS = int(os.environ.get("SPECULATORS_HYBRID_TRAIN_STEPS", "200"))
TRAIN_TIMEOUT_S = float(os.environ.get("SPECULATORS_HYBRID_TRAIN_TIMEOUT", "900"))
# Each entry `kind` or `kind:eager` (torch.compile off for that run only).
KINDS = (
    os.environ.get("SPECULATORS_HYBRID_PIPELINE_KINDS", "dflash eagle3").replace(",", " ").split()
)
EAGER = os.environ.get("SPECULATORS_HYBRID_PIPELINE_EAGER", "") == "1"
# Seconds the whole test may take (the device call's limit less its margin): each training run
# gets what is left of it, less STOCK_S for the stock start-up check, and a run cut there is
# recorded with the steps it reached.
BUDGET_S = float(os.environ.get("SPECULATORS_HYBRID_PIPELINE_BUDGET_S", "inf"))
STOCK_S = 90.0
CUT = "[pipeline] cut at"
SEED_ERROR = "Hybrid KV cache manager is disabled but failed to convert the KV cache specs"

# speculators' trainer with a handler on its own metrics logger (one JSON line per step); the
# trainer, its data loader and its vLLM client are speculators' code, unchanged.
TRAIN_WRAPPER = textwrap.dedent(
    """
    import json, logging, sys, time


    class Lines(logging.Handler):
        def __init__(self, path):
            super().__init__()
            self.out = open(path, "a")

        def emit(self, record):
            if isinstance(record.msg, dict) and "train" in record.msg:
                row = {"step": record.msg.get("global_step"), "t": time.time()}
                row.update(record.msg["train"])
                self.out.write(json.dumps(row) + "\\n")
                self.out.flush()


    def run():
        from speculators.train.cli import main
        from speculators.train.config import TrainConfig
        import speculators.train.cli as cli
        import speculators.train.logger as speculators_logger

        cfg = TrainConfig.resolve(sys.argv[2:])
        setup = speculators_logger.setup_metric_logger

        def with_lines(*args, **kwargs):
            setup(*args, **kwargs)
            logging.getLogger("speculators.metrics").addHandler(Lines(sys.argv[1]))

        speculators_logger.setup_metric_logger = with_lines
        cli.setup_metric_logger = with_lines
        main(cfg)


    if __name__ == "__main__":  # the trainer's loader workers are spawned and import this file
        run()
    """
)


def conversations(path: Path) -> Path:
    """64 short chats in the tiny tokenizer's vocabulary (ASCII letters and spaces)."""
    rng = random.Random(15)
    words = ["".join(rng.choice("abcdefghij") for _ in range(rng.randint(2, 6))) for _ in range(80)]
    with path.open("w") as f:
        for _ in range(CONVERSATIONS):
            user = " ".join(rng.choices(words, k=rng.randint(4, 12)))
            reply = " ".join(rng.choices(words, k=rng.randint(8, 24)))
            turns = [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
            f.write(json.dumps({"conversations": turns}) + "\n")
    return path


def model_with_chat_template(root: Path) -> Path:
    """The tiny checkpoint completed as a real Qwen3.5 one is: a chat template and the image and
    video processor configs. speculators loads `AutoProcessor` for it (prepare-data, and the
    trainer's mask-token lookup); for Qwen3.5 that builds a video processor, which needs
    torchvision (checked on the CPU: without these files or torchvision, both stop there)."""
    folder = hf.build_tiny_model(root / "model", multimodal=True)
    write_chat_files(folder)
    return folder


def launch_argv(folder: Path, storage: Path, port: int) -> list[str]:
    argv = [sys.executable, "-m", "speculators_hybrid.cli", "launch"]
    if launcher := os.environ.get("SPECULATORS_HYBRID_LAUNCHER"):
        argv += ["--launcher", launcher]
    argv += [str(folder), "--hidden-states-path", str(storage), "--"]
    argv += [
        f"--port={port}",
        "--max-model-len=4096",
        "--max-num-seqs=32",
        "--max-num-batched-tokens=2048",
        f"--kv-cache-memory-bytes={2 * 1024**3}",
        "--gpu-memory-utilization=0.3",
        "--gdn-prefill-backend=triton",
        "--enforce-eager",
    ]
    return argv


def speculators_cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "speculators", *args]


def live(path: Path) -> Path:
    """Where a log is written while it grows: `SPECULATORS_HYBRID_GPU_LOGDIR` if set."""
    if logdir := os.environ.get("SPECULATORS_HYBRID_GPU_LOGDIR"):
        Path(logdir).mkdir(parents=True, exist_ok=True)
        return Path(logdir) / path.name
    return path


def run_logged(
    argv: list[str], log: Path, timeout: float, env: dict | None = None, cut_ok: bool = False
) -> str:
    """Run `argv` with its output in `log`; it must exit 0. Past `timeout` its whole process
    group is killed (the trainer's loader workers too): an error, or with `cut_ok` the log so far
    with a last line saying so."""
    log = live(log)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            start_new_session=True,
        )
        try:
            code: int | None = proc.wait(timeout=max(timeout, 1.0))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = None
    text = log.read_text(errors="replace")
    if code is None and cut_ok:
        return text + f"\n{CUT} {timeout:.0f} s\n"
    assert code == 0, f"{' '.join(argv[:6])} ... exited {code}:\n{text[-5000:]}"
    return text


def epochs_for(lengths: list[int], steps: int) -> int:
    """The fewest epochs whose packed batches reach `steps`, by speculators' own sampler (the
    trainer's: one replica, --seed, --total-seq-len). speculators 0.9.0's `--max-steps` only
    ends the current epoch: every later epoch still runs one step and a validation pass, so
    `--epochs` must stop right after the epoch that reaches `steps`."""
    from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2

    sampler = MultipackDistributedBatchSamplerV2(
        batch_max_length=TOTAL_SEQ_LEN, lengths=lengths, num_replicas=1, rank=0, seed=SEED
    )
    epochs = total = 0
    while total < steps:
        sampler.set_epoch(epochs)
        total += len(sampler)
        epochs += 1
    return epochs


def train(
    entry: str,
    folder: Path,
    data: Path,
    work: Path,
    url: str,
    storage: Path,
    epochs: int,
    timeout: float,
) -> dict[str, Any]:
    kind, _, mode = entry.partition(":")
    eager = EAGER or mode == "eager"
    wrapper = work / "train_with_lines.py"
    wrapper.write_text(TRAIN_WRAPPER)
    lines = live(work / f"{entry.replace(':', '-')}-metrics.jsonl")
    lines.unlink(missing_ok=True)  # the wrapper appends; a log folder may hold an earlier run's
    args = [
        f"--speculator-type={kind}",
        f"--verifier-name-or-path={folder}",
        f"--data-path={data}",
        f"--save-path={work / kind}",
        f"--log-dir={work / 'logs'}",
        "--on-missing=generate",
        f"--vllm-endpoint={url}/v1",
        "--target-layer-ids",
        *(str(i) for i in IDS[:-1]),  # the launcher's ids, without the final layer it appends
        "--num-layers=1",
        f"--total-seq-len={TOTAL_SEQ_LEN}",
        f"--seed={SEED}",
        f"--max-steps={STEPS}",
        f"--epochs={epochs}",
        "--lr=1e-3",
        "--scheduler-type=none",
        f"--train-data-ratio={TRAIN_RATIO}",
        "--num-workers=2",
        "--log-freq=1",
        "--checkpoint-freq=1000",
    ]
    argv = [sys.executable, "-m", "speculators_hybrid.cli", "run", "--", sys.executable]
    argv += [str(wrapper), str(lines), *args]
    before = {p.name for p in storage.glob("*.safetensors")}
    start, started = time.monotonic(), time.time()
    env = {"TORCHDYNAMO_DISABLE": "1"} if eager else None
    log = run_logged(argv, work / f"train-{entry.replace(':', '-')}.log", timeout, env, True)
    seconds = time.monotonic() - start
    rows = [json.loads(line) for line in lines.read_text().splitlines()] if lines.exists() else []
    losses = [r["loss"] for r in rows if "loss" in r]
    # speculators folds error_records_sum / error_records_total into "error_records" (per step)
    dropped = sum(r.get("error_records", 0) for r in rows)
    left = sorted({p.name for p in storage.glob("*.safetensors")} - before)
    retries = len(re.findall(r"round trip failed|Retrying|retry", log, flags=re.IGNORECASE))
    k = max(1, len(losses) // 10)
    times = [r["t"] for r in rows]
    return {
        "steps": len(rows),
        "cut_short": CUT in log,
        "loss_first": sum(losses[:k]) / k if losses else None,
        "loss_last": sum(losses[-k:]) / k if losses else None,
        "loss_all_finite": all(x == x and abs(x) != float("inf") for x in losses),
        "dropped_samples": dropped,
        "retry_lines": retries,
        "files_left_unread": len(left),
        "seconds": round(seconds, 1),
        # launch to the first logged step (process start, model build, compile, first samples)
        "first_step_s": round(times[0] - started, 1) if times else None,
        "steps_per_s_after_first": (
            round((len(times) - 1) / (times[-1] - times[0]), 2) if len(times) > 1 else None
        ),
        "verifier_norm_patched": "patches=verifier-norm" in log,
        "torch_compile": not eager,
    }


def test_speculators_pipeline_on_a_hybrid_target(tmp_path_factory, tmp_path: Path) -> None:
    import vllm

    if Version(vllm.__version__).release >= (0, 22):
        pytest.skip("our connector is the writer on vLLM < 0.22 only")
    try:
        import torchvision  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        pytest.fail(
            f"torchvision does not import ({exc}): speculators' AutoProcessor for Qwen3.5 needs "
            "it (torchvision==0.26.0 in tests/gpu/speculators-deps.txt)"
        )
    t0 = time.monotonic()

    def left(reserve: float = 0.0) -> float:
        return BUDGET_S - (time.monotonic() - t0) - reserve

    folder = model_with_chat_template(tmp_path_factory.mktemp("pipeline_model"))
    storage, port = tmp_path / "hs", free_port()
    url = f"http://127.0.0.1:{port}"
    server = Server(
        launch_argv(folder, storage, port), live(tmp_path / "pipeline-server.log"), port
    )
    report: dict[str, Any] = {
        "vllm": vllm.__version__,
        "speculators": SPECULATORS_VERSION,
        "launcher": os.environ.get("SPECULATORS_HYBRID_LAUNCHER", "built-in"),
        "layer_ids": IDS,
        "stage_seconds": {},
    }
    stages = report["stage_seconds"]
    problems: list[str] = []

    def stage(name: str, since: float) -> None:
        stages[name] = round(time.monotonic() - since, 1)

    try:
        since = time.monotonic()
        server.wait_ready()
        stage("server_start", since)
        log = server.text()
        report["command"] = next(
            (ln for ln in log.splitlines() if " serve " in ln and "--speculative" in ln), ""
        )
        ids = json.dumps(IDS).replace(" ", "")
        if ids not in report["command"].replace(" ", "").replace('\\"', '"'):
            problems.append(f"launcher's layer ids are not {IDS}: {report['command']!r}")

        data64 = tmp_path / "data64"
        source = conversations(tmp_path / "chats.jsonl")
        since = time.monotonic()
        run_logged(
            speculators_cli(
                "prepare-data",
                f"--model={folder}",
                f"--data={source}",
                f"--output={data64}",
                f"--seq-length={SEQ_LENGTH}",
                f"--render-endpoint={url}",
                "--num-preprocessing-workers=2",
            ),
            tmp_path / "prepare-data.log",
            600,
        )
        stage("prepare_data", since)
        import datasets

        prepared = datasets.load_from_disk(str(data64))
        report["prepared_samples"] = len(prepared)
        if len(prepared) < CONVERSATIONS:
            problems.append(f"prepare-data kept {len(prepared)} of {CONVERSATIONS} conversations")

        # Offline: speculators writes hs_<i> from our files; check reads them against the data.
        start = time.monotonic()
        run_logged(
            speculators_cli(
                "generate-offline-data", f"--endpoint={url}/v1", f"--preprocessed-data={data64}"
            ),
            tmp_path / "generate-offline-data.log",
            600,
        )
        offline = sorted((data64 / "hidden_states").glob("hs_*.safetensors"))
        report["offline"] = {"files": len(offline), "seconds": round(time.monotonic() - start, 1)}
        if len(offline) != len(prepared):
            problems.append(f"offline generation wrote {len(offline)} of {len(prepared)} files")
        since = time.monotonic()
        checked = subprocess.run(
            [sys.executable, "-m", "speculators_hybrid.cli", "check"]
            + [str(data64 / "hidden_states"), "--dataset", str(data64), "--json"],
            capture_output=True,
            text=True,
            timeout=600,
        )
        report["check_exit"] = checked.returncode
        stage("check", since)
        write_report("speculators-pipeline", report)
        if checked.returncode != 0:
            problems.append(f"speculators-hybrid check failed:\n{checked.stdout[-3000:]}")

        # Online: a fixed 16-sample subset (+4 for validation), hidden states generated per
        # sample by the trainer.
        data16 = tmp_path / "data16"
        subset = prepared.select(range(TRAIN_SAMPLES + VAL_SAMPLES))
        subset.save_to_disk(str(data16))
        lengths = list(subset.with_format(None)["seq_len"])[: int(len(subset) * TRAIN_RATIO)]
        epochs = epochs_for(lengths, STEPS)
        report["train_epochs"] = epochs
        report["train_kinds"] = KINDS
        report["train"] = {}
        for kind in KINDS:
            work = tmp_path / f"train-{kind.replace(':', '-')}"
            work.mkdir()
            timeout = min(TRAIN_TIMEOUT_S, left(STOCK_S))
            row = train(kind, folder, data16, work, url, storage, epochs, timeout)
            report["train"][kind] = row
            write_report("speculators-pipeline", report)  # kept if the run is cut short
            if row["steps"] < STEPS or not row["loss_all_finite"]:
                cut = f" (cut at {timeout:.0f} s)" if row["cut_short"] else ""
                problems.append(
                    f"{kind}: {row['steps']} steps{cut}, finite={row['loss_all_finite']}"
                )
            if row["loss_first"] is None or not row["loss_last"] < 0.7 * row["loss_first"]:
                problems.append(f"{kind}: loss {row['loss_first']} -> {row['loss_last']}")
            for key in ("dropped_samples", "retry_lines", "files_left_unread"):
                if row[key]:
                    problems.append(f"{kind}: {key} = {row[key]}")
        log = server.text()
        report["requests_200"] = len(re.findall(r'"POST /v1/completions HTTP/1\.1" 200', log))
        report["requests_not_200"] = len(
            re.findall(r'"POST /v1/completions HTTP/1\.1" (?!200)\d{3}', log)
        )
        if report["requests_not_200"]:
            problems.append(f"{report['requests_not_200']} completion requests failed")
    finally:
        server.stop()

    # The same launch with the plugin off: stock vLLM 0.20.1 must refuse at start.
    skip = os.environ.get("SPECULATORS_HYBRID_PIPELINE_STOCK", "1") == "0"
    if skip or left() < STOCK_S / 2:
        why = "SPECULATORS_HYBRID_PIPELINE_STOCK=0" if skip else f"{left():.0f} s of budget left"
        report["stock"] = {"skipped": why, "seed_error": None}
        return finish(report, problems)
    stock_log = live(tmp_path / "pipeline-stock-server.log")
    port = free_port()
    env_off = {"SPECULATORS_HYBRID_DISABLE": "1"}
    with stock_log.open("wb") as out:
        stock = subprocess.run(
            launch_argv(folder, tmp_path / "hs-stock", port),
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=max(30.0, min(600.0, left())),
            env={**os.environ, **env_off, "VLLM_USE_FLASHINFER_SAMPLER": "0"},
        )
    stock_text = stock_log.read_text(errors="replace")
    report["stock"] = {"exit": stock.returncode, "seed_error": SEED_ERROR in stock_text}
    if stock.returncode == 0 or SEED_ERROR not in stock_text:
        problems.append(f"stock vLLM did not fail with the seed error:\n{stock_text[-3000:]}")

    finish(report, problems)


def finish(report: dict[str, Any], problems: list[str]) -> None:
    import vllm

    report["problems"] = problems
    write_report("speculators-pipeline", report)
    trained = report.get("train", {})
    summary = " ".join(
        f"{k}: {v['steps']} steps loss {v['loss_first']:.3f}->{v['loss_last']:.3f}"
        for k, v in trained.items()
        if v.get("loss_first") is not None
    )
    print(
        f"[pipeline] SUMMARY vllm={vllm.__version__} speculators={SPECULATORS_VERSION}"
        f" prepared={report.get('prepared_samples')} offline={report.get('offline')}"
        f" check={report.get('check_exit')} {summary} requests={report.get('requests_200')}"
        f" stock_seed_error={report['stock']['seed_error']} problems={len(problems)}"
    )
    assert not problems, "\n".join(problems)
