"""EAGLE-3 auxiliary hidden states for LFM2-MoE (`Lfm2MoeForCausalLM`).

Why: vLLM's `Lfm2MoeForCausalLM` (`lfm2_moe`: LFM2's short gated convolutions + attention, with
sparse MoE feed-forwards after the first dense layers; Liquid's LFM2-8B-A1B) has no
`SupportsEagle3` in any release 0.20.0-0.34.0, so `extract_hidden_states` fails after loading
the weights ("Model does not support EAGLE3 interface"). On 0.20/0.21 vLLM's SpeculativeConfig
also refuses the model type by name (not in its list): extraction-model-type-list
(eagle3_model_types.py) lets it through.
How: as lfm2-eagle3. `Lfm2MoeModel.forward` is replaced by ours (eagle3_aux.py says why it is a
plain function) and `Lfm2MoeForCausalLM` by a subclass with `SupportsEagle3`. Its layers keep a
separate residual (fused add-RMSNorm), so id i is `hidden + residual` after layer i-1, id 0 a
copy of the embeddings (the first layer's in-place residual add would overwrite them), id n the
last layer's stream before `embedding_norm`. Without aux layers the forward is vLLM's own
computation, unchanged.
Upstream: none yet.
"""

from __future__ import annotations

from speculators_hybrid.registry import Patch, Target
from speculators_hybrid.vllm_patches.eagle3_aux import eagle3_class, replacing, residual_forward

MODULE = "vllm.model_executor.models.lfm2_moe"


lfm2_moe_forward = residual_forward("Lfm2MoeModel", "embedding_norm")

PATCH = Patch(
    id="lfm2_moe-eagle3",
    project="vllm",
    versions=">=0.20",
    fixed_upstream="none yet",
    why=__doc__ or "",
    targets=(
        Target(
            MODULE,
            "Lfm2MoeModel.forward",
            replacing(lfm2_moe_forward),
            ("f096226babbc353d",),  # 0.20.0-0.34.0 (the same code as Lfm2Model.forward)
            replaces=True,
        ),
        Target(
            MODULE,
            "Lfm2MoeForCausalLM",
            eagle3_class,
            (
                "cb46991e743ef92e",  # 0.20.0-0.24.0
                "f9b575e58890e99a",  # 0.25.0-0.25.1
                "836522a3f9a8f0c4",  # 0.26.0-0.28.0
                "27997532af5c4816",  # 0.29.0-0.31.0
                "d3312d0cdce8ec8a",  # 0.32.0-0.34.0
            ),
            replaces=True,
        ),
    ),
)
