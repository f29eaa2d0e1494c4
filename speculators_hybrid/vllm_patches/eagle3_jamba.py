"""EAGLE-3 auxiliary hidden states for Jamba (`JambaForCausalLM`).

Why: vLLM's `JambaForCausalLM` (`jamba`: Mamba + attention + MoE, AI21's Jamba) has no
`SupportsEagle3` in any release 0.20.0-0.34.0, so `extract_hidden_states` fails after loading
the weights ("Model does not support EAGLE3 interface"). On 0.20/0.21 vLLM's SpeculativeConfig
also refuses the model type by name (not in its list): extraction-model-type-list
(eagle3_model_types.py) lets it through.
How: `JambaModel.forward` is replaced by ours (eagle3_aux.py says why it is a plain function) and
`JambaForCausalLM` by a subclass with `SupportsEagle3` (`JambaForSequenceClassification` keeps
vLLM's own class as its base). Its layers keep a separate residual (fused add-RMSNorm), so id i
is `hidden + residual` after layer i-1, id 0 a copy of the embeddings (the first layer's in-place
residual add would overwrite them), as for Nemotron-H. Without aux layers the forward is vLLM's
own computation, unchanged.
Upstream: none yet.
"""

from __future__ import annotations

from speculators_hybrid.registry import Patch, Target
from speculators_hybrid.vllm_patches.eagle3_aux import eagle3_class, replacing, residual_forward

MODULE = "vllm.model_executor.models.jamba"


jamba_forward = residual_forward("JambaModel", "final_layernorm")

PATCH = Patch(
    id="jamba-eagle3",
    project="vllm",
    versions=">=0.20",
    fixed_upstream="none yet",
    why=__doc__ or "",
    targets=(
        Target(
            MODULE,
            "JambaModel.forward",
            replacing(jamba_forward),
            ("9a2671486af267f8",),  # 0.20.0-0.34.0
            replaces=True,
        ),
        Target(
            MODULE,
            "JambaForCausalLM",
            eagle3_class,
            (
                "890ffcecbadc2777",  # 0.20.0-0.25.1
                "e4d916f6dd2d0042",  # 0.26.0-0.32.0
                "67190090565dd350",  # 0.33.0-0.34.0
            ),
            replaces=True,
        ),
    ),
)
