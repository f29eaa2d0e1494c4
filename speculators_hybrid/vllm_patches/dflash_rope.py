"""A speculators DFlash drafter of a Qwen3.5-layout target runs with 1-D RoPE (vLLM < 0.34).

Why: speculators (0.9.0: `train/cli.py` `create_transformer_layer_config`) copies the verifier's
rope parameters into the drafter's `transformer_layer_config`; for a Qwen3.5 target it rescales
`mrope_section` to the full head (`partial_rotary_factor` 1.0), drops `mrope_interleaved` and
keeps `mrope_section`, while its own training rotates by plain 1-D text positions. vLLM reads
`mrope_section` in a config as M-RoPE (`transformers_utils/config.py` `_uses_mrope`), and DFlash
is parallel drafting, which the V1 proposer refuses with M-RoPE:
`vllm/v1/spec_decode/llm_base_proposer.py` (0.20.1: lines 195-197 and 319-324)
`_raise_if_mrope` stops the engine at start with "Speculative Decoding with draft models or
parallel drafting does not support M-RoPE yet". The refusal is in every release 0.20.0-0.33.0.
On the GPU a drafter trained by speculators 0.9.0 for such a target stops there, and the same
checkpoint with the M-RoPE fields deleted from its config.json serves and accepts tokens
(benchmarks/acceptance/README.md).
How: where vLLM turns a speculators config into the drafter's transformers config
(`SpeculatorsConfig.extract_transformers_pre_trained_config`, which only speculators-format
checkpoints reach), a `dflash` or `dflash2` drafter (both run as vLLM's method `dflash`) whose
`rope_parameters` or `rope_scaling` carries `mrope_section` loses `mrope_section` and
`mrope_interleaved` there, with one log line. The drafter is then built with 1-D RoPE
(`uses_mrope` False); the target's config is another object and keeps M-RoPE, and an EAGLE-3
drafter (which handles M-RoPE) is left as it is.
The positions this drafter then gets: the runner hands the proposer the target's M-RoPE
positions, a (3, n) view of its `mrope_positions` buffer (`gpu_model_runner.py`
`_get_positions`). The DFlash proposer passes that view to its Triton kernel
(`dflash.py` `set_inputs_first_pass`, `target_positions_ptr=target_positions`), which reads
`target_positions_ptr + i` (`spec_decode/utils.py` `copy_and_expand_dflash_inputs_kernel`), so
the first row (temporal) of each context token, and writes the 1-D context and query positions
the drafter rotates by. For text tokens the three rows are equal to the token position, so
this is the rotation the drafter was trained with; for image tokens the drafter sees the first
row only (multimodal prompts with a DFlash drafter are untested upstream, per `dflash.py`).
vLLM 0.34.0 removed the V1 model runner; its Model Runner V2 DFlash speculator
(`v1/worker/gpu/spec_decode/dflash/speculator.py`) has no such refusal and gives the drafter
1-D positions (`input_buffers.positions`), so 0.34.0 serves the drafter as saved.
Upstream: none yet (0.20.0-0.33.0 refuse; 0.34.0 has no V1 proposer).
"""

from __future__ import annotations

import logging

from speculators_hybrid.registry import Patch, Target
from speculators_hybrid.vllm_patches._targets import (
    EXTRACT,
    EXTRACT_NAME,
    SPECULATORS_CONFIG,
    after_dflash_extract,
)

logger = logging.getLogger("vllm.speculators_hybrid")

MROPE_FIELDS = ("mrope_section", "mrope_interleaved")
ROPE_KEYS = ("rope_parameters", "rope_scaling")


def drop_mrope(config: dict) -> list[str]:
    """Delete the M-RoPE fields from a transformers config dict's rope dicts, where one carries
    `mrope_section`; the keys of the rope dicts changed."""
    changed = []
    for key in ROPE_KEYS:
        rope = config.get(key)
        if isinstance(rope, dict) and "mrope_section" in rope:
            for name in MROPE_FIELDS:
                rope.pop(name, None)
            changed.append(key)
    return changed


def _text_rope(config_dict: dict, config: dict) -> None:
    changed = drop_mrope(config)
    if changed:
        logger.info(
            "speculators-hybrid: %s drafter: mrope_section dropped from its %s, so it runs "
            "with 1-D RoPE (trained with text positions; vLLM's parallel drafting refuses "
            "M-RoPE)",
            config_dict["speculators_model_type"],
            " and ".join(changed),
        )


PATCH = Patch(
    id="dflash-drafter-text-rope",
    project="vllm",
    versions=">=0.20,<0.34",
    fixed_upstream="none yet (vLLM 0.34.0 has no V1 proposer, so no refusal)",
    why=__doc__ or "",
    targets=(Target(SPECULATORS_CONFIG, EXTRACT_NAME, after_dflash_extract(_text_rope), EXTRACT),),
)
