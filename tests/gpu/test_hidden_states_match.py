"""GPU proof: hidden states vLLM extracts from a hybrid Qwen3.5 match a HuggingFace reference.

A tiny random-weight Qwen3.5 (8 layers, Gated DeltaNet : full attention = 3 : 1) is built
locally; vLLM's offline `LLM` runs it with speculators' extraction settings
(`extract_hidden_states` + `ExampleHiddenStatesConnector`), each engine in a fresh process
(this file run as a script); every file it writes is checked against the contract and verified
as `speculators-hybrid verify` does (`hf_reference.check_file`): per token and per layer id against
a float32 HuggingFace forward, within the calibrated margin of the same model's bf16 forward
(speculators_hybrid/verify/rule.py: 1 - s_file <= 3 (1 - s_floor) + 1e-4 at the worst tokens).

Numbers: printed (`pytest -s`) and, if `SPECULATORS_HYBRID_GPU_REPORT` names a file, merged into
it as JSON. `SPECULATORS_HYBRID_GPU_LOGDIR`, if set, receives each engine's log.
On vLLM 0.20.1/0.21 this needs the speculators-hybrid plugin installed (vLLM loads it itself).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from functools import cache
from pathlib import Path
from typing import Any

import pytest

IDS = [1, 4, 5, 8]  # distinct, ascending, includes n = 8 (the final pre-norm state)
ENGINE_TIMEOUT_S = float(os.environ.get("SPECULATORS_HYBRID_GPU_TIMEOUT", "400"))
LENGTHS = (7, 100, 513, 1500)  # 513 and 1500 exceed max_num_batched_tokens: chunked prefill
VOCAB_FOR_PROMPTS = 1020  # ids 1..1019: plain tokens (0 is EOS, 1020..1023 vision specials)

if __name__ != "__main__":
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU", allow_module_level=True)
    pytest.importorskip("vllm")
    import hf_reference as hf  # tests/gpu is on sys.path (pytest rootdir-less import)

pytestmark = pytest.mark.gpu


# ---------------------------------------------------------------- prompts


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1, VOCAB_FOR_PROMPTS) for _ in range(n)]


def prompt_batches(seed: int = 0) -> list[list[list[int]]]:
    """Two generate calls; the second shares long prefixes with the first (cache hits if on)."""
    rng = random.Random(seed)
    first = [_tokens(rng, n) for n in LENGTHS]
    p100, p513, p1500 = first[1], first[2], first[3]
    second = [
        p1500[:1200] + _tokens(rng, 77),  # diverges after 1200 shared tokens
        p513 + _tokens(rng, 300),  # extends a whole earlier prompt
        list(p1500),  # repeats one exactly
        list(p100),  # short repeat: maybe under one (hybrid-sized) block
    ]
    return [first, second]


# ---------------------------------------------------------------- engine process (script side)


def model_runner(llm: Any) -> str:
    """The model runner the engine chose: V2 where vLLM has no other (0.34+), else what the
    engine's config says (0.22+; `VLLM_USE_V2_MODEL_RUNNER=1` before that)."""
    import importlib.util

    if importlib.util.find_spec("vllm.v1.worker.gpu_model_runner") is None:
        return "V2"
    config = llm.llm_engine.vllm_config
    if hasattr(type(config), "use_v2_model_runner"):
        return "V2" if config.use_v2_model_runner else "V1"
    return "V2" if os.environ.get("VLLM_USE_V2_MODEL_RUNNER") == "1" else "V1"


def engine_main(spec_path: str) -> None:
    """Runs in a fresh process: one vLLM engine, all batches, results as JSON."""
    import dataclasses

    import vllm
    from vllm import LLM, SamplingParams
    from vllm.engine.arg_utils import EngineArgs

    spec = json.loads(Path(spec_path).read_text())
    extraction = {
        "speculative_config": {
            "method": "extract_hidden_states",
            "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": spec["ids"]}},
        },
        "kv_transfer_config": {
            "kv_connector": "ExampleHiddenStatesConnector",
            "kv_role": "kv_producer",
            "kv_connector_extra_config": {"shared_storage_path": spec["storage"]},
        },
    }
    kwargs: dict[str, Any] = dict(
        model=spec["model"],
        tokenizer=spec["model"],
        **(extraction if spec["ids"] else {}),  # no ids: plain serving, the capacity baseline
        enable_prefix_caching=spec["prefix_caching"],
        kv_cache_memory_bytes=2 * 1024**3,
        max_num_seqs=8,
        enforce_eager=spec.get("enforce_eager", True),
        max_num_batched_tokens=512,
        max_model_len=4096,
        gpu_memory_utilization=0.3,
    )
    fields = {f.name for f in dataclasses.fields(EngineArgs)}
    if "gdn_prefill_backend" in fields:  # no FlashInfer on the device: Triton GDN prefill
        kwargs["gdn_prefill_backend"] = "triton"
    if spec["language_model_only"]:
        kwargs["language_model_only"] = True
    print(f"engine: vllm {vllm.__version__} pid {os.getpid()} kwargs {kwargs}", flush=True)
    llm = LLM(**kwargs)
    results = []
    for batch in spec["batches"]:
        outputs = llm.generate(
            [{"prompt_token_ids": p} for p in batch], SamplingParams(max_tokens=1), use_tqdm=False
        )
        results.append(
            [
                {
                    "request_id": o.request_id,
                    "prompt_token_ids": list(o.prompt_token_ids or []),
                    "path": (o.kv_transfer_params or {}).get("hidden_states_path"),
                    "num_cached_tokens": o.num_cached_tokens,
                }
                for o in outputs
            ]
        )
    out = Path(spec["result"])
    record = {"vllm": vllm.__version__, "runner": model_runner(llm), "batches": results}
    out.with_suffix(".tmp").write_text(json.dumps(record))
    out.with_suffix(".tmp").rename(out)
    print("engine: done", flush=True)


# ---------------------------------------------------------------- test side


def _tail(path: Path, chars: int = 6000) -> str:
    text = path.read_text(errors="replace") if path.exists() else "(no log)"
    return text[-chars:]


def _wait(proc: subprocess.Popen, result: Path) -> int | None:
    """Exit code, or None on timeout; once results exist, a hung shutdown gets 60 s, then 0."""
    deadline = time.monotonic() + ENGINE_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            return proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            if result.exists():
                deadline = min(deadline, time.monotonic() + 60)
    return 0 if result.exists() else None


def run_engine(spec: dict[str, Any], workdir: Path, name: str) -> dict[str, Any]:
    """Run `engine_main` in a new session; kill the whole process group when it ends."""
    spec = {**spec, "storage": str(workdir / "hs"), "result": str(workdir / "result.json")}
    spec_path = workdir / "spec.json"
    spec_path.write_text(json.dumps(spec))
    log = workdir / "engine.log"
    env = dict(os.environ, VLLM_USE_FLASHINFER_SAMPLER="0", PYTHONUNBUFFERED="1")
    # vLLM's default (engine core in its own process): with it off, files come one step late.
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, __file__, str(spec_path)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        try:
            rc = _wait(proc, Path(spec["result"]))
        finally:  # the engine core and its workers are in the same process group
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
    keep_log(log, f"engine-{name}.log")
    if rc is None:
        limit = f"{ENGINE_TIMEOUT_S:.0f} s"
        pytest.fail(f"engine {name} timed out after {limit}; log tail:\n{_tail(log)}")
    result = Path(spec["result"])
    if rc != 0 or not result.exists():
        pytest.fail(f"engine {name} exited with {rc}; log tail:\n{_tail(log)}")
    data = json.loads(result.read_text())
    sizes = re.findall(r"GPU KV cache size: ([\d,]+) tokens", log.read_text(errors="replace"))
    data["kv_cache_tokens"] = int(sizes[-1].replace(",", "")) if sizes else None
    data["plugin_lines"] = [
        line.strip()
        for line in log.read_text(errors="replace").splitlines()
        if "speculators-hybrid" in line
    ][:8]
    return data


@cache
def _model(folder: str) -> Any:
    """The checkpoint (Qwen3.5, or the dense Qwen3 control), loaded once per folder."""
    if hf.reference_device() == "cuda":  # fla/causal_conv1d installed: keep float32 exact-ish
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    return hf.load_model(folder, hf.reference_device())


def write_report(case: str, entry: dict[str, Any]) -> None:
    path = os.environ.get("SPECULATORS_HYBRID_GPU_REPORT")
    if not path:
        return
    report = json.loads(Path(path).read_text()) if Path(path).exists() else {}
    report.setdefault("cases", {})[case] = entry
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(report, indent=2))


def keep_log(log: Path, name: str) -> None:
    """Copy `log` as `name` into `SPECULATORS_HYBRID_GPU_LOGDIR`, if set."""
    if logdir := os.environ.get("SPECULATORS_HYBRID_GPU_LOGDIR"):
        Path(logdir).mkdir(parents=True, exist_ok=True)
        shutil.copy(log, Path(logdir) / name)


def check_extracted(
    label: str,
    path: str | Path,
    prompt: list[int],
    folder: Path,
    ids: list[int],
    row: dict[str, Any],
    problems: list[str],
) -> None:
    """One file against the contract and verify's calibrated rule: its worst similarity per id
    (the cosine when the norms agree) goes into `row["min_cos"]`, the bf16 floor's into
    `row["floor"]`, what is wrong into `problems`."""
    try:
        result = hf.check_file(path, prompt, ids, _model(str(folder)))
    except AssertionError as e:
        problems.append(f"{label}: {e}")
        return
    row["min_cos"] = {r.layer_id: r.similarity for r in result.ids}
    row["floor"] = {r.layer_id: r.floor for r in result.ids}
    if not result.ok:
        problems.append(f"{label}: {'; '.join(result.reasons())}")


def worst_per_id(rows: list[dict[str, Any]], ids: list[int]) -> tuple[dict[int, Any], str]:
    """The lowest min cosine of each id over the rows (None if no file), and as text."""
    per_id = {i: min((r["min_cos"][i] for r in rows if "min_cos" in r), default=None) for i in ids}
    text = " ".join(f"{i}:{c:.5f}" if c is not None else f"{i}:n/a" for i, c in per_id.items())
    return per_id, text


def check_case(
    case: str,
    folder: Path,
    workdir: Path,
    prefix_caching: bool,
    language_model_only: bool,
    batches: list[list[list[int]]],
    ids: list[int] = IDS,
    enforce_eager: bool = True,
) -> None:
    spec = dict(
        model=str(folder),
        ids=ids,
        prefix_caching=prefix_caching,
        language_model_only=language_model_only,
        batches=batches,
        enforce_eager=enforce_eager,
    )
    data = run_engine(spec, workdir, case)
    rows: list[dict[str, Any]] = []
    problems: list[str] = []
    for b, (prompts, outputs) in enumerate(zip(batches, data["batches"], strict=True)):
        assert len(outputs) == len(prompts), f"{case}: batch {b}: {len(outputs)} outputs"
        for prompt, out in zip(prompts, outputs, strict=True):
            label = f"batch{b}/len{len(prompt)}"
            row: dict[str, Any] = {"prompt": label, "num_cached_tokens": out["num_cached_tokens"]}
            rows.append(row)
            if out["prompt_token_ids"] != prompt:
                problems.append(f"{label}: output prompt_token_ids differ from the prompt")
            if not out["path"] or not Path(out["path"]).exists():
                problems.append(f"{label}: no hidden-states file ({out['path']!r})")
                continue
            check_extracted(label, out["path"], prompt, folder, ids, row, problems)
    per_id, worst = worst_per_id(rows, ids)
    entry = {
        "vllm": data["vllm"],
        "runner": data.get("runner"),
        "reference_device": hf.reference_device(),
        "ids": ids,
        "min_cos_per_id": per_id,
        "prompts": rows,
        "plugin_lines": data["plugin_lines"],
        "problems": problems,
    }
    write_report(case, entry)
    for r in rows:
        cos = " ".join(f"{i}:{c:.5f}" for i, c in r.get("min_cos", {}).items()) or "n/a"
        floor = " ".join(f"{i}:{c:.5f}" for i, c in r.get("floor", {}).items()) or "n/a"
        print(
            f"[hidden-states] {case} {r['prompt']} cached={r['num_cached_tokens']} min_cos {cos}"
            f" floor {floor}"
        )
    files = sum("min_cos" in r for r in rows)
    print(
        f"[hidden-states] SUMMARY {case} vllm={data['vllm']} files={files}/{len(rows)}"
        f" min cos per id {worst} problems={len(problems)}"
    )
    assert not problems, f"{case}:\n" + "\n".join(problems)
    if prefix_caching:
        hits = [r["num_cached_tokens"] or 0 for r in rows if r["prompt"].startswith("batch1/")]
        if any("prefix caching turned off" in line for line in data["plugin_lines"]):
            # the plugin said it turned caching off (0.22-0.23 without chunks, Mamba "all" mode).
            assert max(hits) == 0, f"{case}: caching reported off, yet hits: {hits}"
        else:
            assert max(hits) > 0, f"{case}: prefix caching on but no cache hit in batch 1: {hits}"


@pytest.fixture(scope="module")
def multimodal_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return hf.build_tiny_model(tmp_path_factory.mktemp("qwen3_5_tiny") / "model", multimodal=True)


@pytest.mark.parametrize("prefix_caching", [False, True], ids=["prefix-off", "prefix-on"])
def test_hidden_states_match_hf(
    multimodal_model: Path, tmp_path: Path, prefix_caching: bool
) -> None:
    case = f"qwen3_5-multimodal-{'prefix-on' if prefix_caching else 'prefix-off'}"
    check_case(case, multimodal_model, tmp_path, prefix_caching, True, prompt_batches())


def test_hidden_states_match_hf_text_only(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    """`Qwen3_5ForCausalLM` checkpoint: on vLLM < 0.27 served through the plugin's registration
    (qwen3_5-text-only-models); from 0.27 through vLLM's own class."""
    root = tmp_path_factory.mktemp("qwen3_5_text")
    folder = hf.build_tiny_model(root / "model", multimodal=False)
    check_case("qwen3_5-text-prefix-off", folder, tmp_path, False, False, prompt_batches()[:1])


def build_qwen3_control(folder: Path) -> Path:
    """A tiny random dense Qwen3 (8 layers): vLLM's RMSNorm adds the residual in place there."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=1024,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        eos_token_id=0,
        pad_token_id=0,
        bos_token_id=None,
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).eval().to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    model.save_pretrained(folder, safe_serialization=True)
    hf.write_tokenizer(folder, config.vocab_size)
    return folder


@pytest.mark.parametrize(
    ("name", "eager"),
    [("qwen3_5-multimodal", True), ("qwen3-control", True), ("qwen3-control", False)],
    ids=["qwen3_5-eager", "qwen3-eager", "qwen3-compiled"],
)
def test_layer_zero_is_the_embeddings(
    multimodal_model: Path, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, name, eager
) -> None:
    """Id 0 = HF's hidden_states[0] (the embeddings); it came back equal to id n (issue 3)."""
    if name == "qwen3-control":
        folder = build_qwen3_control(tmp_path_factory.mktemp("qwen3_control") / "model")
    else:
        folder = multimodal_model
    case = f"{name}-layer0-{'eager' if eager else 'compiled'}"
    mm = name != "qwen3-control"
    batches = prompt_batches()[:1]
    check_case(case, folder, tmp_path, False, mm, batches, [0, 4, 8], eager)


if __name__ == "__main__":
    engine_main(sys.argv[1])
