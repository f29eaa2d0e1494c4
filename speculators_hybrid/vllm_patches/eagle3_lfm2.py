"""EAGLE-3 auxiliary hidden states for LFM2 (`Lfm2ForCausalLM`).

Why: vLLM's `Lfm2ForCausalLM` (`lfm2`: short gated convolutions + attention, Liquid's LFM2) has
no `SupportsEagle3` in any release 0.20.0-0.34.0, so `extract_hidden_states` fails after loading
the weights ("Model does not support EAGLE3 interface"). On 0.20/0.21 vLLM's SpeculativeConfig
also refuses the model type by name (not in its list): extraction-model-type-list
(eagle3_model_types.py) lets it through.
How: `Lfm2Model.forward` is replaced by ours (eagle3_aux.py says why it is a plain function) and
`Lfm2ForCausalLM` by a subclass with `SupportsEagle3`. Its layers keep a separate residual (fused
add-RMSNorm), so id i is `hidden + residual` after layer i-1, id 0 a copy of the embeddings (the
first layer's in-place residual add would overwrite them), as for Nemotron-H. Without aux layers
the forward is vLLM's own computation, unchanged (0.33's `Lfm2BidirectionalModel` inherits it).
Upstream: none yet.
"""

from __future__ import annotations

from speculators_hybrid.registry import Patch, Target
from speculators_hybrid.vllm_patches.eagle3_aux import eagle3_class, replacing, residual_forward

MODULE = "vllm.model_executor.models.lfm2"


lfm2_forward = residual_forward("Lfm2Model", "embedding_norm")

PATCH = Patch(
    id="lfm2-eagle3",
    project="vllm",
    versions=">=0.20",
    fixed_upstream="none yet",
    why=__doc__ or "",
    targets=(
        Target(
            MODULE,
            "Lfm2Model.forward",
            replacing(lfm2_forward),
            ("f096226babbc353d",),  # 0.20.0-0.34.0
            replaces=True,
        ),
        Target(
            MODULE,
            "Lfm2ForCausalLM",
            eagle3_class,
            (
                "e2c1fa3442d7eb71",  # 0.20.0-0.24.0
                "8385554ac9c0d44e",  # 0.25.0-0.28.0
                "ebb4267905968a09",  # 0.29.0-0.31.0
                "76a0391e239d6fd4",  # 0.32.0-0.34.0
            ),
            replaces=True,
        ),
    ),
)
