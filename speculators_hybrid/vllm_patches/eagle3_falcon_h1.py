"""EAGLE-3 auxiliary hidden states for Falcon-H1 (`FalconH1ForCausalLM`).

Why: vLLM's `FalconH1ForCausalLM` (`falcon_h1`: each layer runs attention and Mamba-2 side by
side) has no `SupportsEagle3` in any release 0.20.0-0.34.0, so `extract_hidden_states` fails
after loading the weights ("Model does not support EAGLE3 interface"). On 0.20/0.21 vLLM's
SpeculativeConfig also refuses the model type by name (not in its list): extraction-model-type-
list (eagle3_model_types.py) lets it through.
How: `FalconH1Model.forward` is replaced by ours (eagle3_aux.py says why it is a plain function)
and `FalconH1ForCausalLM` by a subclass with `SupportsEagle3`. Each `FalconH1ParallelHybrid`
layer takes and returns the residual stream itself (no separate residual), so id i is the output
of layer i-1, id 0 the embeddings after `embedding_multiplier` (a copy): HF's
`hidden_states[i]`. Without aux layers the forward is vLLM's own computation, unchanged.
Upstream: none yet.
"""

from __future__ import annotations

from itertools import islice
from typing import Any

from speculators_hybrid.registry import Patch, Target
from speculators_hybrid.vllm_patches.eagle3_aux import add, eagle3_class, layers_of, replacing

MODULE = "vllm.model_executor.models.falcon_h1"


def falcon_h1_forward(
    self: Any,
    input_ids: Any,
    positions: Any,
    intermediate_tensors: Any = None,
    inputs_embeds: Any = None,
) -> Any:
    """vLLM's `FalconH1Model.forward`, returning `(hidden, aux)` when aux ids are set."""
    from vllm.distributed.parallel_state import get_pp_group
    from vllm.sequence import IntermediateTensors

    pp = get_pp_group()
    if pp.is_first_rank:
        embeds = inputs_embeds if inputs_embeds is not None else self.embed_input_ids(input_ids)
        hidden = embeds * self.embedding_multiplier
    else:
        assert intermediate_tensors is not None
        hidden = intermediate_tensors["hidden_states"]
    wanted = layers_of(self)
    aux: list[Any] = []
    if pp.is_first_rank:
        add(aux, wanted, 0, hidden)
    for index, layer in enumerate(
        islice(self.layers, self.start_layer, self.end_layer), start=self.start_layer + 1
    ):
        hidden = layer(positions=positions, hidden_states=hidden)
        add(aux, wanted, index, hidden)
    if not pp.is_last_rank:
        return IntermediateTensors({"hidden_states": hidden})
    hidden = self.final_layernorm(hidden)
    return (hidden, aux) if aux else hidden


PATCH = Patch(
    id="falcon_h1-eagle3",
    project="vllm",
    versions=">=0.20",
    fixed_upstream="none yet",
    why=__doc__ or "",
    targets=(
        Target(
            MODULE,
            "FalconH1Model.forward",
            replacing(falcon_h1_forward),
            ("c03e2b8d34f71bc2",),  # 0.20.0-0.34.0
            replaces=True,
        ),
        Target(
            MODULE,
            "FalconH1ForCausalLM",
            eagle3_class,
            (
                "1ba29e7b2ac8c2fc",  # 0.20.0-0.24.0
                "7c34d9c61603ef0f",  # 0.25.0-0.28.0
                "7d33d33ebbb16cee",  # 0.29.0-0.31.0
                "eb3571054ab4593e",  # 0.32.0
                "4775ab15581cb762",  # 0.33.0-0.34.0
            ),
            replaces=True,
        ),
    ),
)
