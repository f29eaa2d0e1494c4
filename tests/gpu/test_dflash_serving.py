"""GPU: dflash-causal-draft-blocks and dflash-drafter-text-rope on a running engine.

A DFlash drafter in the shape speculators 0.9.0 saves by default (every draft layer a
sliding-window layer, `sliding_window_non_causal: false`, the target's M-RoPE section) for the
tiny Qwen3.5 target (its language model only: the folder has no processor files), both with
random weights (`load_format="dummy"`), is served by vLLM + plugin, eager and with CUDA graphs,
each engine in its own process: it starts, drafts, and logs that its draft blocks are served
causal; with `dflash-causal-draft-blocks` off it serves them non-causal.
Random weights accept next to nothing: what trained drafters accept is the acceptance loop's
(benchmarks/acceptance). Results: $GPU_RESULTS (JSON), if set.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from speculators_hybrid.models import drafter_config, write_config  # noqa: E402
from speculators_hybrid.versions import installed  # noqa: E402
from speculators_hybrid.vllm_patches import dflash_causal  # noqa: E402

pytestmark = pytest.mark.gpu
if not dflash_causal.PATCH.needed_for(installed("vllm")):
    pytest.skip(
        f"vLLM {installed('vllm')} sets the blocks' causality itself", allow_module_level=True
    )

CAUSAL_LOG = "draft blocks are served causal"
ENGINE = r"""
import json, sys
from vllm import LLM, SamplingParams
target, drafter, eager = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
llm = LLM(model=target, load_format="dummy", skip_tokenizer_init=True, max_model_len=1024,
          kv_cache_memory_bytes=2 << 30, gpu_memory_utilization=0.2, enforce_eager=eager,
          disable_log_stats=False, gdn_prefill_backend="triton", seed=0, language_model_only=True,
          speculative_config={"method": "dflash", "model": drafter, "num_speculative_tokens": 3})
ids = [[(7 * i + j) % 1000 + 2 for j in range(40 + 30 * i)] for i in range(8)]
prompts = [{"prompt_token_ids": p} for p in ids]
params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True, detokenize=False)
outs = llm.generate(prompts, params, use_tqdm=False)
metrics = {m.name: getattr(m, "value", None) for m in llm.get_metrics()}
print("RESULT " + json.dumps({
    "tokens": [len(o.outputs[0].token_ids) for o in outs],
    "drafts": metrics.get("vllm:spec_decode_num_drafts"),
    "accepted": metrics.get("vllm:spec_decode_num_accepted_tokens"),
}))
"""


def serve(tmp: Path, eager: bool, disabled: str = "") -> dict:
    target = write_config(tmp / "target", "tiny")
    drafter = tmp / "drafter"
    drafter.mkdir(exist_ok=True)
    (drafter / "config.json").write_text(json.dumps(drafter_config(target, layers=2)))
    env = dict(os.environ, SPECULATORS_HYBRID_DISABLED_PATCHES=disabled)
    done = subprocess.run(
        [sys.executable, "-c", ENGINE, str(target), str(drafter), "1" if eager else "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=420,
    )
    out = done.stdout + done.stderr
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert done.returncode == 0 and line, out[-3000:]
    return {**json.loads(line[len("RESULT ") :]), "causal_logged": CAUSAL_LOG in out}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    found: dict[str, dict] = {}
    yield found
    if os.environ.get("GPU_RESULTS"):
        Path(os.environ["GPU_RESULTS"]).write_text(json.dumps(found, indent=2))


@pytest.mark.parametrize("eager", [True, False], ids=["eager", "cuda-graphs"])
def test_a_causal_trained_drafter_serves_with_causal_blocks(tmp_path, results, eager):
    got = serve(tmp_path, eager)
    results[f"plugin-{'eager' if eager else 'graphs'}"] = got
    assert got["tokens"] == [48] * 8
    assert got["drafts"] and got["drafts"] > 0
    assert got["causal_logged"]


def test_with_the_patch_off_the_same_drafter_serves_non_causal(tmp_path, results):
    got = serve(tmp_path, eager=True, disabled=dflash_causal.PATCH.id)
    results["patch-off-eager"] = got
    assert got["tokens"] == [48] * 8 and got["drafts"] and got["drafts"] > 0
    assert not got["causal_logged"]
