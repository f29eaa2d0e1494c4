"""EAGLE-3 auxiliary hidden states for Nemotron-H (`NemotronHForCausalLM`) on vLLM < 0.22.

Why: vLLM 0.20.0-0.21.x's `NemotronHForCausalLM` (Mamba-2 + attention + MoE; Nemotron-H,
Nemotron Nano 2/3, Nemotron 3 Super) has no `SupportsEagle3`, so `extract_hidden_states` fails
after loading the weights ("Model does not support EAGLE3 interface").
How: `NemotronHModel.forward` is replaced by ours (eagle3_aux.py says why it is a plain
function) and `NemotronHForCausalLM` by a subclass with `SupportsEagle3`. Its layers keep a
separate residual (fused add-RMSNorm), so id i is `hidden + residual` after layer i-1, id 0 a
copy of the embeddings (the first layer's in-place residual add would overwrite them), as
vLLM 0.22's own `NemotronHModel` collects them. Without aux layers the forward is vLLM's own
computation, unchanged.
Upstream: vLLM PR 43130, released in 0.22.0.
"""

from __future__ import annotations

from speculators_hybrid.registry import Patch, Target
from speculators_hybrid.vllm_patches.eagle3_aux import eagle3_class, replacing, residual_forward

MODULE = "vllm.model_executor.models.nemotron_h"


nemotron_h_forward = residual_forward("NemotronHModel", "norm_f")

PATCH = Patch(
    id="nemotron_h-eagle3",
    project="vllm",
    versions=">=0.20,<0.22",
    fixed_upstream="vLLM PR 43130, released in 0.22.0",
    why=__doc__ or "",
    targets=(
        Target(
            MODULE,
            "NemotronHModel.forward",
            replacing(nemotron_h_forward),
            ("088714c49bb3148d",),  # 0.20.0-0.21.0
            replaces=True,
        ),
        Target(
            MODULE,
            "NemotronHForCausalLM",
            eagle3_class,
            ("1c9753b2cd8aa2cc",),  # 0.20.0-0.21.0
            replaces=True,
        ),
    ),
)
