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

from itertools import islice
from typing import Any

from speculators_hybrid.registry import Patch, Target
from speculators_hybrid.vllm_patches.eagle3_aux import add, eagle3_class, layers_of, replacing

MODULE = "vllm.model_executor.models.nemotron_h"


def nemotron_h_forward(
    self: Any,
    input_ids: Any,
    positions: Any,
    intermediate_tensors: Any = None,
    inputs_embeds: Any = None,
) -> Any:
    """vLLM's `NemotronHModel.forward`, returning `(hidden, aux)` when aux ids are set."""
    from vllm.distributed.parallel_state import get_pp_group
    from vllm.sequence import IntermediateTensors

    pp = get_pp_group()
    if pp.is_first_rank:
        hidden = inputs_embeds if inputs_embeds is not None else self.embed_input_ids(input_ids)
        residual = None
    else:
        assert intermediate_tensors is not None
        hidden = intermediate_tensors["hidden_states"]
        residual = intermediate_tensors["residual"]
    wanted = layers_of(self)
    aux: list[Any] = []
    if pp.is_first_rank:
        add(aux, wanted, 0, hidden)
    for index, layer in enumerate(
        islice(self.layers, self.start_layer, self.end_layer), start=self.start_layer + 1
    ):
        hidden, residual = layer(positions=positions, hidden_states=hidden, residual=residual)
        if index in wanted:
            add(aux, wanted, index, hidden if residual is None else hidden + residual)
    if not pp.is_last_rank:
        return IntermediateTensors({"hidden_states": hidden, "residual": residual})
    hidden, _ = self.norm_f(hidden, residual)
    return (hidden, aux) if aux else hidden


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
