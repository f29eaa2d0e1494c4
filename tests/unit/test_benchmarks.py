"""benchmarks/extraction.py and engine.py without a GPU: arguments, models, files, logs, table."""

from __future__ import annotations

import fcntl
import gzip
import importlib.util
import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import engine  # noqa: E402
from benchmarks import extraction as bench  # noqa: E402
from speculators_hybrid.extraction import extraction_args  # noqa: E402
from speculators_hybrid.models import write_config  # noqa: E402

# ---------------------------------------------------------------- arguments and models


def test_defaults_are_the_issue_settings(monkeypatch):
    monkeypatch.delenv("SPECULATORS_HYBRID_DISABLE", raising=False)
    args = bench.parse_args([])
    assert (args.prompts, args.prompt_len, args.warmup) == (64, 512, 1)
    assert args.models == ["control", "hybrid"] and args.modes == ["plain", "extract"]
    assert (args.size, args.cuda_graphs, args.plugin) == ("wide-8l", "auto", "on")


def test_the_real_size_has_its_own_defaults():
    args = bench.parse_args(["--size", "qwen3.6-27b"])
    assert (args.prompts, args.prompt_len, args.repeats, args.warmup) == (64, 2048, 2, 1)
    assert (args.kv_cache_gib, args.max_model_len, args.max_num_batched_tokens) == (20, 8192, 16384)
    assert args.engine_timeout == 480 and args.workload == "fixed"
    given = bench.parse_args(["--size", "qwen3.6-27b", "--repeats", "5", "--kv-cache-gib", "9"])
    assert (given.repeats, given.kv_cache_gib, given.prompt_len) == (5, 9, 2048)
    small = bench.parse_args(["--size", "tiny"])  # the other sizes keep the old defaults
    assert (small.prompt_len, small.repeats, small.kv_cache_gib, small.engine_timeout) == (
        512,
        3,
        8,
        300,
    )


def test_chat_prompts_must_fit_the_model_length():
    with pytest.raises(SystemExit):
        bench.parse_args(["--workload", "chat"])  # wide-8l: 4096 by default
    assert bench.parse_args(["--workload", "chat", "--max-model-len", "8192"]).workload == "chat"
    assert bench.parse_args(["--size", "qwen3.6-27b", "--workload", "chat"]).max_model_len == (8192)


def test_chat_mix_is_seeded_and_within_bounds():
    mix = bench.prompt_lengths("chat", 64, 2048)
    assert mix == bench.prompt_lengths("chat", 64, 2048) != bench.prompt_lengths("chat", 64, 0, 1)
    assert len(mix) == 64 and all(100 <= n <= 8000 for n in mix)
    assert min(mix) < 300 and max(mix) > 3000  # spread over the range (log-uniform)
    assert bench.prompt_lengths("fixed", 3, 7) == [7, 7, 7]
    info = bench.workload_info("chat", mix)
    assert info["total_tokens"] == sum(mix) and info["prompts"] == 64
    assert info["mix"] == "log-uniform 100-8000 tokens, seed 0"
    assert (info["min"], info["max"]) == (min(mix), max(mix))
    assert "mix" not in bench.workload_info("fixed", [7, 7])


def test_disable_variable_sets_the_plugin_flag(monkeypatch):
    monkeypatch.setenv("SPECULATORS_HYBRID_DISABLE", "1")
    assert bench.parse_args([]).plugin == "off"
    assert bench.parse_args(["--plugin", "on"]).plugin == "on"


def test_prompts_must_fit_the_model_length():
    with pytest.raises(SystemExit):
        bench.parse_args(["--prompt-len", "4096", "--max-model-len", "4096"])
    args = bench.parse_args(["--prompt-len", "100", "--models", "hybrid", "--modes", "extract"])
    assert (args.prompt_len, args.models, args.modes) == (100, ["hybrid"], ["extract"])


def test_hybrid_is_realistic_width_with_distinct_ids(tmp_path):
    info = bench.model_info("hybrid", "wide-8l")
    config = json.loads((write_config(tmp_path, "wide-8l") / "config.json").read_text())
    text = config["text_config"]
    assert info["hidden"] == text["hidden_size"] and 2048 <= info["hidden"] <= 5120
    assert info["layers"] == text["num_hidden_layers"] == 8
    assert text["layer_types"].count("full_attention") == 2
    assert info["layer_ids"] == [2, 4, 5, 8]
    assert "6 GDN + 2 attention" in info["describe"] and info["multimodal"]


def test_real_size_is_the_27b_preset(tmp_path):
    info = bench.model_info("hybrid", "qwen3.6-27b")
    assert (info["layers"], info["hidden"], info["vocab"]) == (64, 5120, 248320)
    assert info["layer_ids"] == [2, 32, 61, 64] and info["multimodal"]
    assert "48 GDN + 16 attention layers" in info["describe"]
    assert "GDN state float32" in info["describe"] and "dummy weights" in info["describe"]
    assert "dummy" not in bench.model_info("hybrid", "wide-8l")["describe"]
    look_alike = bench.model_info("hybrid", "qwen3.6-27b-bf16-state")
    assert "GDN state" not in look_alike["describe"] and "dummy weights" in look_alike["describe"]


def test_the_old_real_size_name_runs_the_look_alike_with_a_note(capsys):
    args = bench.parse_args(["--size", "qwen3.6-27b-like"])
    assert args.size == "qwen3.6-27b-bf16-state" and args.kv_cache_gib == 20
    err = capsys.readouterr().err
    assert "'qwen3.6-27b-like' is deprecated" in err and err.count("\n") == 1
    assert bench.parse_args(["--size", "qwen3.6-27b"]).size == "qwen3.6-27b"
    assert capsys.readouterr().err == ""


def test_dummy_models_are_a_config_only(tmp_path):
    transformers = pytest.importorskip("transformers")
    size = "qwen3.6-27b"
    bench.ensure_models(list(bench.KINDS), size, tmp_path, "cpu")
    hybrid = bench.model_folder(tmp_path, "hybrid", size)
    assert sorted(p.name for p in hybrid.iterdir()) == ["built.json", "config.json"]
    assert (hybrid / "config.json").read_text() == (
        write_config(tmp_path / "ref", size, multimodal=True) / "config.json"
    ).read_text()
    control = bench.model_folder(tmp_path, "control", size)
    assert sorted(p.name for p in control.iterdir()) == ["built.json", "config.json"]
    config = transformers.AutoConfig.from_pretrained(control)
    assert (config.hidden_size, config.num_hidden_layers, config.vocab_size) == (5120, 64, 248320)


def test_control_matches_the_hybrid_width():
    control, hybrid = bench.model_info("control", "wide-8l"), bench.model_info("hybrid", "wide-8l")
    assert (control["hidden"], control["layers"], control["vocab"]) == (
        hybrid["hidden"],
        hybrid["layers"],
        hybrid["vocab"],
    )
    assert not control["hybrid"] and not control["multimodal"]


def test_layer_ids_are_speculators_default():
    assert bench.layer_ids(64) == [2, 32, 61, 64]
    assert bench.layer_ids(8) == [2, 4, 5, 8]


def test_built_models_load_in_transformers(tmp_path):
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    bench.ensure_models(list(bench.KINDS), "tiny", tmp_path, "cpu")
    for kind in bench.KINDS:
        info, folder = bench.model_info(kind, "tiny"), bench.model_folder(tmp_path, kind, "tiny")
        assert json.loads((folder / "built.json").read_text()) == info
        config = transformers.AutoConfig.from_pretrained(folder)
        assert config.model_type == ("qwen3_5" if info["hybrid"] else "qwen3")
        text = config.text_config if info["multimodal"] else config
        assert (text.hidden_size, text.num_hidden_layers) == (info["hidden"], info["layers"])
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder)  # as vLLM loads it
        assert len(tokenizer) == info["vocab"] and tokenizer.eos_token_id == 0
        assert (folder / "model.safetensors").stat().st_size > 0
    mtime = (folder / "model.safetensors").stat().st_mtime
    bench.ensure_models(list(bench.KINDS), "tiny", tmp_path, "cpu")  # already built: kept
    assert (folder / "model.safetensors").stat().st_mtime == mtime


# ---------------------------------------------------------------- engine settings


def spec(mode: str, kind: str = "hybrid") -> dict:
    info = bench.model_info(kind, "wide-8l")
    return dict(
        mode=mode,
        folder="/models/x",
        storage="/tmp/hs",
        eager=False,
        kv_cache_bytes=8 << 30,
        gpu_memory_utilization=0.5,
        max_num_seqs=64,
        max_num_batched_tokens=16384,
        max_model_len=4096,
        **{k: info[k] for k in ("hybrid", "multimodal", "layer_ids")},
    )


def test_plain_engine_has_no_extraction():
    kw = engine.engine_kwargs(spec("plain"), {"gdn_prefill_backend"})
    assert "speculative_config" not in kw and "kv_transfer_config" not in kw
    assert kw["enable_prefix_caching"] is False and kw["enforce_eager"] is False
    assert kw["language_model_only"] is True and kw["gdn_prefill_backend"] == "triton"


def test_dummy_engine_needs_no_checkpoint_or_tokenizer():
    for mode in bench.MODES:
        kw = engine.engine_kwargs(spec(mode) | {"dummy": True}, set())
        assert (kw["load_format"], kw["skip_tokenizer_init"], kw["dtype"]) == (
            "dummy",
            True,
            "bfloat16",
        )
        assert "tokenizer" not in kw and kw["language_model_only"] is True
        assert ("kv_transfer_config" in kw) == (mode != "plain")
    kw = engine.engine_kwargs(spec("plain"), set())
    assert kw["tokenizer"] == "/models/x" and "load_format" not in kw
    assert "skip_tokenizer_init" not in kw


def test_instep_mode_extracts_with_writes_in_the_step(monkeypatch):
    monkeypatch.setenv(bench.ASYNC_WRITES, "1")
    assert bench.engine_env("on", "extract-instep")[bench.ASYNC_WRITES] == "0"
    assert bench.engine_env("on", "extract")[bench.ASYNC_WRITES] == "1"  # inherited
    monkeypatch.delenv(bench.ASYNC_WRITES)
    assert bench.ASYNC_WRITES not in bench.engine_env("on", "extract")
    instep = engine.engine_kwargs(spec("extract-instep"), set())
    assert instep == engine.engine_kwargs(spec("extract"), set())  # only the variable differs


@pytest.mark.parametrize(
    ("mode", "variable", "value"),
    [
        ("extract-wide", "SPECULATORS_HYBRID_WIDE_HIDDEN", "1"),
        ("extract-onelayer", "SPECULATORS_HYBRID_WIDE_HIDDEN", "0"),
        ("extract-prefill-only", "SPECULATORS_HYBRID_PREFILL_ONLY", "1"),
        (
            "extract-accepted-wait",
            "SPECULATORS_HYBRID_DISABLED_PATCHES",
            "no-accepted-count-wait-in-prefill",
        ),
        ("extract-save-file", "SPECULATORS_HYBRID_SAFETENSORS_SAVE", "1"),
        ("extract-paced", "SPECULATORS_HYBRID_COPY_CHUNK_MIB", "8"),
        ("extract-paced2", "SPECULATORS_HYBRID_COPY_CHUNK_MIB", "2"),
    ],
)
def test_layout_modes_differ_from_extract_by_one_variable(monkeypatch, mode, variable, value):
    monkeypatch.delenv(variable, raising=False)
    assert bench.engine_env("on", mode)[variable] == value
    assert variable not in bench.engine_env("on", "extract")
    assert engine.writes_files(mode)
    assert engine.engine_kwargs(spec(mode), set()) == engine.engine_kwargs(spec("extract"), set())


def test_file_digest_tells_equal_files_from_different_ones(tmp_path):
    """`digest` hashes the hidden-state bytes only, wherever the header puts them: the same
    states after other token ids hash the same, one changed byte does not."""
    states = bytes(range(48))  # [2, 3, 4] bf16

    def write(name: str, data: bytes, tokens: list[int]) -> str:
        ids = struct.pack(f"<{len(tokens)}q", *tokens)  # token ids first in the data
        header = {
            "token_ids": {"dtype": "I64", "shape": [len(tokens)], "data_offsets": [0, len(ids)]},
            "hidden_states": {
                "dtype": "BF16",
                "shape": [2, 3, 4],
                "data_offsets": [len(ids), len(ids) + len(data)],
            },
        }
        raw = json.dumps(header).encode()
        path = tmp_path / name
        path.write_bytes(struct.pack("<Q", len(raw)) + raw + ids + data)
        return str(path)

    a = engine.digest(write("a", states, [5, 6]))
    b = engine.digest(write("b", states, [7, 8]))
    c = engine.digest(write("c", states[:-1] + b"\x01", [5, 6]))
    assert a == b and a["sha256"] != c["sha256"]
    assert a["shape"] == [2, 3, 4]


def benchmark_connector(mode: str) -> tuple[str, str]:
    """(kv_connector, its module) of `mode`'s engine, whose core finds the module first on its
    PYTHONPATH."""
    transfer = engine.engine_kwargs(spec(mode), set())["kv_transfer_config"]
    root = str(Path(bench.__file__).resolve().parents[1])
    assert bench.engine_env("on", mode)["PYTHONPATH"].split(os.pathsep)[0] == root
    return transfer["kv_connector"], transfer["kv_connector_module_path"]


def test_nofiles_mode_runs_the_benchmark_connector_and_expects_no_files():
    assert benchmark_connector("extract-nofiles") == ("NoFilesConnector", "benchmarks.nofiles")
    kw = engine.engine_kwargs(spec("extract-nofiles"), set())
    assert (
        kw["speculative_config"]
        == engine.engine_kwargs(spec("extract"), set())["speculative_config"]
    )
    assert not engine.writes_files("extract-nofiles") and engine.writes_files("extract")


def test_timeline_mode_runs_the_timing_connector_and_writes_files(monkeypatch):
    assert benchmark_connector("extract-timeline") == ("TimelineConnector", "benchmarks.timeline")
    assert engine.writes_files("extract-timeline")
    monkeypatch.setattr(engine, "own_connector_gone", lambda: True)  # vLLM >= 0.22
    assert benchmark_connector("extract-timeline") == (
        "TimelineConnector",
        "benchmarks.timeline_upstream",
    )


def test_a_timeline_is_summed_up_as_seconds_into_the_pass(tmp_path):
    log = tmp_path / "files.timeline.jsonl"
    rows = [
        dict(path="a", submitted=100.5, started=100.6, copied=100.7, written=101.0),
        dict(path="b", submitted=102.0, started=102.0, copied=102.2, written=102.6),
        dict(call="GPUModelRunner.execute_model", host_s=0.25),
        dict(call="GPUModelRunner.execute_model", host_s=0.5),
        dict(call="TimelineConnector.save_kv_layer", host_s=0.125),
    ]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = engine.timeline(log, 100.0, 2.7)
    assert got.pop("host") == {
        "GPUModelRunner.execute_model": dict(calls=2, total_s=0.75, max_s=0.5),
        "TimelineConnector.save_kv_layer": dict(calls=1, total_s=0.125, max_s=0.125),
    }
    assert got == pytest.approx(
        dict(
            files=2,
            last_submitted_s=2.0,
            last_copied_s=2.2,
            last_written_s=2.6,
            returned_s=2.7,
            mean_queue_s=0.05,
            mean_copy_wait_s=0.15,
            mean_write_s=0.35,
        )
    )
    assert not log.exists()  # the next pass starts a new one
    assert engine.timeline(log, 100.0, 2.7) is None


def test_extract_engine_uses_speculators_settings():
    kw = engine.engine_kwargs(spec("extract", "control"), set())
    expected = extraction_args((2, 4, 5, 8), "/tmp/hs")
    assert kw["speculative_config"] == expected["speculative_config"]
    assert kw["kv_transfer_config"] == expected["kv_transfer_config"]
    assert "language_model_only" not in kw and "gdn_prefill_backend" not in kw
    plain = engine.engine_kwargs(spec("plain", "control"), set())
    assert {k: v for k, v in kw.items() if k in plain} == plain  # nothing else differs


def test_prompts_are_reproducible_and_plain_tokens():
    a = engine.make_prompts([7] * 4, 2048, seed=1)
    assert a == engine.make_prompts([7] * 4, 2048, seed=1) != engine.make_prompts([7] * 4, 2048, 2)
    assert [len(p) for p in a] == [7] * 4
    assert all(1 <= t <= 2048 - 5 for p in a for t in p)
    assert [len(p) for p in engine.make_prompts([3, 100, 1], 2048, 0)] == [3, 100, 1]


def test_cpu_seconds_cover_the_children(tmp_path):
    before = engine.cpu_seconds(os.getpid())
    busy = "import time\nt = time.time()\nwhile time.time() - t < 0.5: pass\ntime.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", busy])
    try:
        time.sleep(1.5)
        assert child.pid in engine.cpu_seconds(os.getpid())
        used = engine.cpu_used(before, os.getpid())
        assert used["engine"] > 0.01 and used["frontend"] >= 0
    finally:
        child.kill()
        child.wait()
    assert engine.median_of([{"x": 1}, {"x": 3}, {"x": 2}], lambda r: r["x"]) == 2
    assert engine.median_of([{"x": 1}, {"x": None}], lambda r: r["x"]) is None


def test_a_driver_stopped_by_sigterm_takes_its_engine_down(tmp_path):
    """device.sh's `timeout` sends SIGTERM to the driver; the engine (here a stand-in that
    sleeps, started by the real run_engine) must not outlive it and keep the GPU."""
    pid_file = tmp_path / "engine.pid"
    standin = tmp_path / "standin.py"
    standin.write_text(
        f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(120)\n"
    )
    driver = (
        f"import sys; sys.path.insert(0, {str(Path(bench.__file__).parents[1])!r})\n"
        "from benchmarks import extraction as bench\n"
        "bench.ensure_models = lambda *args: None\n"
        f"bench.__file__ = {str(standin)!r}\n"
        f"sys.exit(bench.main(['--out', {str(tmp_path / 'out')!r}, '--work', "
        f"{str(tmp_path / 'work')!r}, '--models', 'hybrid', '--size', 'tiny', "
        "'--modes', 'extract', '--engine-timeout', '60']))\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", driver])
    engine_pid = None
    try:
        deadline = time.monotonic() + 30
        while not pid_file.exists() or not pid_file.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, "the engine never started"
            time.sleep(0.1)
        engine_pid = int(pid_file.read_text())
        proc.terminate()
        code = proc.wait(timeout=20)
        with pytest.raises(ProcessLookupError):
            os.kill(engine_pid, 0)
        assert code == 143
    finally:
        proc.kill()
        if engine_pid is not None:
            try:
                os.kill(engine_pid, 9)
            except ProcessLookupError:
                pass


# ---------------------------------------------------------------- files


def write_safetensors(path: Path, rows: int, cut: int = 0) -> None:
    """A hidden-states file by the format's spec (no torch): [rows, 2, 4] bf16 + int64 ids."""
    hidden = rows * 2 * 4 * 2
    header = {
        "hidden_states": {"dtype": "BF16", "shape": [rows, 2, 4], "data_offsets": [0, hidden]},
        "token_ids": {"dtype": "I64", "shape": [rows], "data_offsets": [hidden, hidden + 8 * rows]},
    }
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    data = struct.pack("<Q", len(raw)) + raw + bytes(hidden + 8 * rows)
    path.write_bytes(data[: len(data) - cut])


def test_a_whole_file_is_complete(tmp_path):
    path = tmp_path / "a.safetensors"
    write_safetensors(path, 5)
    assert engine.header_rows(str(path)) == 5
    assert engine.file_complete(str(path), 5)
    assert not engine.file_complete(str(path), 6)


def test_a_file_being_written_is_not(tmp_path):
    path = tmp_path / "a.safetensors"
    assert not engine.file_complete(str(path), 5)  # not there yet
    write_safetensors(path, 5, cut=3)
    assert engine.header_rows(str(path)) is None
    assert not engine.file_complete(str(path), 5)
    path.write_bytes(b"\x10\x00")
    assert not engine.file_complete(str(path), 5)


def test_a_held_lock_means_not_complete(tmp_path):
    path = tmp_path / "a.safetensors"
    write_safetensors(path, 5)
    with open(f"{path}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        assert not engine.file_complete(str(path), 5)
        fcntl.flock(lock, fcntl.LOCK_UN)
        assert engine.file_complete(str(path), 5)


def test_wait_for_files_reports_what_never_came(tmp_path):
    done, late = tmp_path / "done.safetensors", tmp_path / "late.safetensors"
    write_safetensors(done, 3)
    _, missing = engine.wait_for_files({str(done): 3, str(late): 3}, timeout_s=0.05)
    assert missing == [str(late)]
    write_safetensors(late, 3)
    _, missing = engine.wait_for_files({str(done): 3, str(late): 3}, timeout_s=0.05)
    assert missing == []
    (tmp_path / "late.safetensors.lock").touch()
    engine.clear(str(tmp_path))
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- logs and table

CORE = "(EngineCore_DP0 pid=12) "
LOG = "\n".join(
    [
        "INFO 11-29 12:00:01 [plugin.py:61] speculators-hybrid: pid=11 role=frontend"
        " vllm=0.20.1 patches=keep-hma-for-extraction,hidden-states-own-group",
        CORE + "INFO 11-29 12:00:09 [plugin.py:61] speculators-hybrid: pid=12 role=engine-core"
        " vllm=0.20.1 patches=keep-hma-for-extraction,hidden-states-write-slots",
        CORE + "\x1b[1;36mINFO\x1b[0m 11-29 12:00:30 [kv_cache_utils.py:1708]"
        " GPU KV cache size: 1,234,560 tokens",
        CORE + "INFO 11-29 12:00:30 [kv_cache_utils.py:1710]"
        " Maximum concurrency for 4,096 tokens per request: 301.40x",
    ]
)


def test_log_gives_kv_capacity_and_plugin_state():
    got = bench.parse_log(LOG)
    assert got["kv_cache_tokens"] == 1234560 and got["max_concurrency"] == 301.40
    assert got["plugin"] == {
        "state": "active",
        "patches": [
            "hidden-states-own-group",
            "hidden-states-write-slots",
            "keep-hma-for-extraction",
        ],
        "roles": ["engine-core", "frontend"],
    }


def test_log_without_plugin_or_kv_line():
    off = bench.parse_log("INFO speculators-hybrid: disabled by SPECULATORS_HYBRID_DISABLE, pid=3")
    assert off["plugin"]["state"] == "disabled" and off["kv_cache_tokens"] is None
    assert bench.parse_log("nothing")["plugin"]["state"] == "not loaded"
    none = bench.parse_log("speculators-hybrid: pid=1 role=worker vllm=0.25.0 patches=none")
    assert none["plugin"]["state"] == "loaded, no patch for this vLLM"


def fake_run(mode: str, rate: float, kv: int, **extra) -> dict:
    info = bench.model_info("hybrid", "wide-8l")
    return {
        "kind": bench.KIND,
        "name": f"vllm0.20.1-plugin-on-hybrid-{mode}",  # the old names: read as they are
        "date": "2026-11-29",
        "gpu": "NVIDIA H200",
        "vllm": "0.20.1",
        "model": info,
        "mode": mode,
        "settings": dict(
            prompts=64,
            prompt_len=512,
            repeats=3,
            eager=False,
            max_num_batched_tokens=16384,
            kv_cache_bytes=8 << 30,
            layer_ids=info["layer_ids"],
        ),
        "storage_fs": "ext4",
        "cuda_graphs_error": None,
        "speculators_hybrid": "0.1.0 (abc1234)",
        "plugin_flag": "on",
        "plugin": {"state": "active", "patches": ["keep-hma-for-extraction"], "roles": []},
        "tokens_per_s_returned": rate,
        "kv_cache_tokens": kv,
        **extra,
    }


def test_table_pairs_plain_and_extraction(tmp_path):
    runs = [
        fake_run("plain", 1e5, 1000000, kv_bytes_per_token=8589.9),
        fake_run("extract", 6e4, 200000, tokens_per_s_files=5e4, file_bytes_per_token=32776)
        | {"kv_bytes_per_token": 42949.7},
    ]
    for run in runs:
        (tmp_path / f"{run['name']}.json").write_text(json.dumps(run))
    (tmp_path / "other.json").write_text("[]")  # not a run: ignored
    (tmp_path / "x.engine.json").write_text("{")  # unreadable: ignored
    text = bench.table(bench.load_runs(tmp_path))
    head, rule, row = text.splitlines()
    assert head.count("|") == rule.count("|") == row.count("|") == 16
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:4] == [
        "2026-11-29",
        "NVIDIA H200",
        "0.20.1",
        "0.1.0 (abc1234) (active: keep-hma-for-extraction)",
    ]
    assert cells[4].startswith("hybrid: Qwen3.5 layout, 6 GDN + 2 attention layers, hidden 4096")
    assert "64x512 tok" in cells[5] and "CUDA graphs" in cells[5] and "KV 8 GiB" in cells[5]
    assert cells[6:] == [
        "extract",
        "100,000",
        "60,000 / 50,000",
        "0.60 / 0.50",
        "1,000,000 / 200,000 (0.20)",
        "8,590 / 42,950",
        "32,776",
        "n/a",  # older runs: no GB/s, no CPU time
        "n/a / n/a",
    ]


def test_table_has_a_row_per_extraction_mode():
    chat = {"name": "chat", "prompts": 64, "total_tokens": 123456, "mix": "log-uniform"}
    new = dict(workload=chat, files_gb_per_s=3.456)
    runs = [
        fake_run("plain", 1e5, 1000000, workload=chat, engine_cpu_ms_per_step_est=12.34),
        fake_run("extract", 9e4, 200000, tokens_per_s_files=8e4, **new),
        fake_run("extract-instep", 3e4, 200000, tokens_per_s_files=3e4, **new)
        | {"engine_cpu_ms_per_step_est": 56.78, bench.ASYNC_WRITES: "0"},
        fake_run("plain", 2e5, 1000000),  # another workload: a row of its own
    ]
    lines = bench.table(runs).splitlines()
    assert len(lines) == 5
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    chat_rows = [r for r in rows if "chat mix" in r[5]]
    assert [r[6] for r in chat_rows] == ["extract", "extract-instep"]
    extract, instep = chat_rows
    assert "chat mix 64 prompts 100-8000 tok (total 123,456)" in extract[5]
    assert "in-step" not in extract[5] and instep[5].endswith(
        "in-step writes (SPECULATORS_HYBRID_ASYNC_WRITES=0)"
    )
    assert (extract[9], instep[9]) == ("0.90 / 0.80", "0.30 / 0.30")  # against the chat plain
    assert (extract[13], instep[13]) == ("3.46", "3.46")
    assert (extract[14], instep[14]) == ("12.3 / n/a", "12.3 / 56.8")
    fixed = [r for r in rows if "64x512 tok" in r[5]]
    assert len(fixed) == 1 and fixed[0][6] == "plain only" and fixed[0][7] == "200,000"


def test_table_says_when_files_were_written_off_the_step():
    run = fake_run("extract", 6e4, 200000, SPECULATORS_HYBRID_ASYNC_WRITES="1")
    assert bench.settings_text(run).endswith("files on ext4, async writes")
    assert "async" not in bench.settings_text(fake_run("extract", 6e4, 200000))


def test_table_marks_failures_and_missing_numbers():
    failed = fake_run("extract", None, None, error="engine exited 1", cuda_graphs_error="boom")
    failed["settings"]["eager"] = True
    row = bench.table([failed]).splitlines()[2]
    assert "FAILED: vllm0.20.1-plugin-on-hybrid-extract" in row
    assert "eager (graphs failed)" in row
    assert "| n/a | n/a / n/a | n/a / n/a | n/a / n/a (n/a) | n/a / n/a | n/a | n/a |" in row


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="would start vLLM")
def test_a_failing_engine_is_retried_eager_and_reported(tmp_path, capsys):
    """The whole driver without vLLM: each engine fails, is retried eager, and is tabled."""
    work, out = tmp_path / "work", tmp_path / "out"
    for kind in bench.KINDS:  # pretend the models are built: no torch needed
        folder = bench.model_folder(work, kind, "tiny")
        folder.mkdir(parents=True)
        (folder / "built.json").write_text(json.dumps(bench.model_info(kind, "tiny")))
    argv = ["--size", "tiny", "--work", str(work), "--out", str(out), "--engine-timeout", "60"]
    assert bench.main(argv) == 1
    runs = bench.load_runs(out)
    assert sorted(f"{r['model']['kind']}-{r['mode']}" for r in runs) == [
        "control-extract",
        "control-plain",
        "hybrid-extract",
        "hybrid-plain",
    ]
    for run in runs:
        assert "engine exited 1" in run["error"] and "ModuleNotFoundError" in run["error"]
        assert run["cuda_graphs_error"] and run["settings"]["eager"] is True
        assert run["kv_cache_tokens"] is None and run["plugin"]["state"] == "not loaded"
    table = (out / "table.md").read_text()
    assert table.count("FAILED") == 2 and table.count("\n") == 4  # head, rule, a row per model
    assert table in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [*(f"{r['name']}.json" for r in runs), "table.md"]
    )


# ---------------------------------------------------------------- shared prefix (issue 17)


def test_shared_prefix_workload_shares_exactly_the_prefix_per_pass():
    args = bench.parse_args(
        ["--workload", "shared-prefix", "--prompt-len", "2000", "--max-model-len", "4096"]
    )
    assert (args.prompts, args.shared_prefix_len, args.prefix_caching) == (64, 1000, "off")
    lengths = bench.prompt_lengths(args.workload, args.prompts, args.prompt_len)
    prompts = engine.make_prompts(lengths, 1000, seed=0, shared=args.shared_prefix_len)
    assert [len(p) for p in prompts] == [2000] * 64
    assert len({tuple(p[:1000]) for p in prompts}) == 1  # one system prompt
    assert len({p[1000] for p in prompts}) > 1 and len({tuple(p[1000:]) for p in prompts}) == 64
    other = engine.make_prompts(lengths, 1000, seed=1, shared=1000)  # the next pass: its own
    assert other[0][:1000] != prompts[0][:1000]
    assert engine.make_prompts([5, 5], 1000, 0) != engine.make_prompts([5, 5], 1000, 0, 3)
    assert engine.make_prompts([2], 1000, 0, 3) == [engine.make_prompts([3], 1000, 0, 3)[0][:2]]
    with pytest.raises(SystemExit):  # the prefix must leave tokens of its own to each prompt
        bench.parse_args(["--workload", "shared-prefix", "--shared-prefix-len", "2000"])


def test_prefix_caching_flag_reaches_the_engine_and_the_table():
    on = bench.parse_args(["--workload", "shared-prefix", "--prefix-caching", "on"])
    off = bench.parse_args(["--workload", "shared-prefix", "--shared-prefix-len", "256"])
    assert bench.run_name(on, "hybrid", "extract") != bench.run_name(off, "hybrid", "extract")
    assert "shared-prefix-prefix-caching-extract" in bench.run_name(on, "hybrid", "extract")
    assert (
        engine.engine_kwargs(spec("extract") | {"prefix_caching": True}, set())[
            "enable_prefix_caching"
        ]
        is True
    )
    assert engine.engine_kwargs(spec("extract"), set())["enable_prefix_caching"] is False
    shared = {"name": "shared-prefix", "prompts": 64, "total_tokens": 128000}
    runs = []
    for caching in (True, False):
        for mode in ("plain", "extract"):
            run = fake_run(mode, 1e5, 10**6, workload=shared, prefix_caching_in_engine=caching)
            run["settings"].update(prompt_len=2000, shared_prefix=1000, prefix_caching=caching)
            runs.append(run)
    rows = bench.table(runs).splitlines()[2:]
    assert len(rows) == 2  # on and off side by side, each beside its own plain
    assert sum("prefix caching on" in r for r in rows) == 1
    assert all("64x2000 tok sharing a 1000-tok prefix" in r for r in rows)
    runs[1]["prefix_caching_in_engine"] = False  # the plugin turned it off for extraction
    assert "prefix caching asked, off in the engine" in bench.settings_text(runs[1])


def trace_event(cat: str, name: str, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}


def test_trace_gaps_names_where_the_gpu_waited(tmp_path):
    """Kernels on two streams overlap (one busy span); the 5 ms gap is named by the CPU
    ranges open at its middle, annotation first, and by the kernels either side; the 0.5 ms gap
    is below 1 ms; copies apart; host time summed per annotation."""
    from benchmarks import trace_gaps

    events = [
        trace_event("kernel", "gemm", 0, 10_000),
        trace_event("kernel", "gather", 8_000, 4_000),  # another stream, overlapping
        trace_event("kernel", "norm", 17_000, 3_000),  # after a 5 ms gap
        trace_event("kernel", "gemm", 20_500, 1_000),  # after 0.5 ms
        trace_event("gpu_memcpy", "Memcpy DtoH", 12_000, 2_000),
        trace_event("user_annotation", "gpu_model_runner: draft", 11_000, 6_500),
        trace_event("user_annotation", "engine step", 0, 30_000),
        trace_event("cpu_op", "aten::index_select", 13_000, 2_000),
        {"ph": "i", "cat": "kernel", "name": "marker", "ts": 5},  # not a span
    ]
    trace = tmp_path / "t.pt.trace.json.gz"
    with gzip.open(trace, "wt") as f:
        json.dump({"traceEvents": events}, f)
    got = trace_gaps.of_folder(tmp_path)
    assert got["trace"] == trace.name
    assert got["window_s"] == pytest.approx(0.0215)
    assert got["gpu_idle_s"] == pytest.approx(0.0055)
    assert got["gaps"] == 1 and got["idle_in_gaps_s"] == pytest.approx(0.005)
    (gap,) = got["largest_gaps"]
    assert gap["at_s"] == pytest.approx(0.012) and gap["ms"] == pytest.approx(5.0)
    assert gap["cpu"] == ["gpu_model_runner: draft", "engine step", "aten::index_select"]
    assert (gap["after_kernel"], gap["before_kernel"]) == ("gather", "norm")
    assert got["by_innermost_cpu_range"] == {"gpu_model_runner: draft": {"count": 1, "s": 0.005}}
    assert got["copies_s"] == pytest.approx(0.002)
    assert got["host_by_annotation"] == {
        "engine step": {"count": 1, "s": pytest.approx(0.03)},
        "gpu_model_runner: draft": {"count": 1, "s": pytest.approx(0.0065)},
    }


def test_trace_gaps_says_what_it_cannot_read(tmp_path, capsys):
    from benchmarks import trace_gaps

    assert trace_gaps.of_folder(tmp_path) is None
    (tmp_path / "rank0").mkdir()  # vLLM may write each worker's trace in a folder of its own
    (tmp_path / "rank0" / "cut.pt.trace.json").write_text('{"traceEvents": [')
    assert trace_gaps.of_folder(tmp_path)["error"].startswith("JSONDecodeError")
    with pytest.raises(SystemExit):
        trace_gaps.main([str(tmp_path)])
    assert f"{tmp_path / 'rank0' / 'cut.pt.trace.json'}:" in capsys.readouterr().err
