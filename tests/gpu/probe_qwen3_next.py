"""Where Qwen3-Next's extracted states leave transformers' (issue 19): the tiny checkpoint of
test_hybrid_families.py in three variants, each through check_case with every layer id.

- `as-is`: Gated DeltaNet x 3 + attention, MoE in every layer (the failing case);
- `dense`: a dense MLP in layers 0-2 (`mlp_only_layers`), MoE in layer 3 only (vLLM's class
  refuses a model with no MoE layer: "No Qwen3Next layer found", H200, vLLM 0.25.0): ids 1-3
  then isolate the GDN path;
- `attention-moe`: every layer full attention, MoE kept: isolates the MoE path.

Run on the GPU machine (vLLM with its MoE kernels staged, KEEP_MOE=1):
`python3 tests/gpu/probe_qwen3_next.py OUTDIR [VARIANT ...]`; one JSON report in OUTDIR.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import hf_reference as hf  # noqa: E402
from test_hidden_states_match import check_case, prompt_batches  # noqa: E402
from test_hybrid_families import _config  # noqa: E402

VARIANTS: dict[str, dict] = {
    "as-is": {},
    "dense": {"mlp_only_layers": [0, 1, 2]},
    "attention-moe": {"layer_types": ["full_attention"] * 4},
}


def build(folder: Path, overrides: dict) -> Path:
    import transformers

    from speculators_hybrid.models import save_random_model

    body = {**_config("qwen3_next"), **overrides}
    config = transformers.AutoConfig.for_model(
        body["model_type"], **{k: v for k, v in body.items() if k != "model_type"}
    )
    folder = save_random_model(folder, transformers.Qwen3NextForCausalLM, config, seed=0)
    hf.write_tokenizer(folder, config.vocab_size)
    return folder


def main(out: str, names: list[str]) -> int:
    os.environ["SPECULATORS_HYBRID_GPU_REPORT"] = str(Path(out) / "qwen3-next-probe.json")
    failed = []
    for name in names or list(VARIANTS):
        overrides = VARIANTS[name]
        work = Path(tempfile.mkdtemp(prefix=f"qn-{name}-"))
        folder = build(work / "model", overrides)
        try:
            check_case(
                f"qwen3_next-{name}",
                folder,
                work,
                False,
                False,
                [prompt_batches()[0][:2]],  # the 7- and 100-token prompts that fail
                [0, 1, 2, 3, 4],
            )
        except AssertionError as e:
            failed.append(name)
            print(f"[probe] {name}: {str(e)[:600]}", flush=True)
    print(f"[probe] failed variants: {failed}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
