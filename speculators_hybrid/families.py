"""Which hybrid model families hidden-state extraction serves, from which vLLM release.

Extraction reads EAGLE-3 auxiliary hidden states, so the target's vLLM model class must
implement vLLM's `SupportsEagle3`; without it vLLM fails only after loading the weights
("Model does not support EAGLE3 interface"). `FAMILIES` names every hybrid `model_type`
(launcher/target.py's HYBRID_MODEL_TYPES is made from it) and, for each, the class vLLM builds
for it and the first release in the test matrix (support.VLLM) whose class has them, with this
plugin loaded (it registers the text-only Qwen3.5 classes before vLLM 0.27, and adds them to
Nemotron-H before 0.22 and to GraniteMoeHybrid, Falcon-H1, LFM2, LFM2-MoE, Jamba and Zamba2).
`launch` and `doctor` refuse a family on an earlier release in one line that names the first
release that works; docs/support.md's family table is made from it (`scripts/matrix.py table`).
tests/cpu/test_families.py checks every entry against the installed vLLM's own classes, so each
release of the matrix confirms its column.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from speculators_hybrid import support


@dataclass(frozen=True)
class Family:
    model_type: str
    architecture: str  # the vLLM model class built for it (the launcher's command uses it)
    first: str | None  # first release in support.VLLM with SupportsEagle3; None: none of them
    # the class supports Mamba prefix caching: vLLM caches its state per block ('all' mode)
    mamba_all_mode: bool = False

    def extracts_on(self, vllm: str) -> bool:
        return self.first is not None and Version(vllm) >= Version(self.first)


FAMILIES: tuple[Family, ...] = (
    Family("qwen3_5", "Qwen3_5ForConditionalGeneration", "0.20.0"),
    Family("qwen3_5_text", "Qwen3_5ForCausalLM", "0.20.0"),
    Family("qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration", "0.20.0"),
    Family("qwen3_5_moe_text", "Qwen3_5MoeForCausalLM", "0.20.0"),
    Family("qwen3_next", "Qwen3NextForCausalLM", "0.24.0"),
    Family(
        "nemotron_h", "NemotronHForCausalLM", "0.20.0", mamba_all_mode=True
    ),  # patch nemotron_h-eagle3 < 0.22
    # patch granitemoehybrid-eagle3 (< 0.26 also granite-layer-type-names: transformers >= 5.13's
    # layer type names); on 0.20/0.21 these six also need extraction-model-type-list
    Family("granitemoehybrid", "GraniteMoeHybridForCausalLM", "0.20.0", mamba_all_mode=True),
    Family(
        "falcon_h1", "FalconH1ForCausalLM", "0.20.0", mamba_all_mode=True
    ),  # patch falcon_h1-eagle3, as granite
    Family(
        "jamba", "JambaForCausalLM", "0.20.0", mamba_all_mode=True
    ),  # patch jamba-eagle3, as granite
    Family(
        "bamba", "BambaForCausalLM", None, mamba_all_mode=True
    ),  # vLLM 0.24.0 removed the class (not patched)
    Family(
        "zamba2", "Zamba2ForCausalLM", "0.20.0", mamba_all_mode=True
    ),  # patch zamba2-eagle3, as granite
    Family("lfm2", "Lfm2ForCausalLM", "0.20.0"),  # patch lfm2-eagle3, as granite
    Family("lfm2_moe", "Lfm2MoeForCausalLM", "0.20.0"),  # patch lfm2_moe-eagle3, as granite
)
BY_TYPE = {f.model_type: f for f in FAMILIES}


def refusal(model_type: str, vllm: str | None) -> str | None:
    """Why extraction from `model_type` cannot work on vLLM `vllm` (None: it can, or we do not
    know the family, or the version for a family that some release serves)."""
    family = BY_TYPE.get(model_type)
    if family is None:
        return None
    if family.first is not None:
        try:
            release = Version(Version(vllm or "").base_version)
        except InvalidVersion:
            return None
        if family.extracts_on(str(release)) or release < Version(support.OLDEST):
            return None  # before the matrix's first release: unknown (launch warns of age)
    who = f"vLLM {vllm}'s" if vllm else "vLLM's"
    why = (
        f"{who} {family.architecture} ({model_type}) has no EAGLE-3 auxiliary hidden "
        "states (vLLM's SupportsEagle3), so hidden-state extraction cannot work: vLLM would "
        "fail after loading the weights"
    )
    if family.first is None:
        return f"{why}; no vLLM release up to {support.NEWEST} adds them for {model_type}"
    return f"{why}; the first release that has them is vLLM {family.first}"
