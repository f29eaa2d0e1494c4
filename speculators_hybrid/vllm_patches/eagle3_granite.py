"""EAGLE-3 auxiliary hidden states for Granite 4.0-H (`GraniteMoeHybridForCausalLM`).

Why: vLLM's `GraniteMoeHybridForCausalLM` (Mamba-2 + attention, `granitemoehybrid`) has no
`SupportsEagle3` in any release 0.20.0-0.34.0, so `extract_hidden_states` fails after loading
the weights ("Model does not support EAGLE3 interface"). On 0.20/0.21 vLLM's SpeculativeConfig
also refuses the model type by name (not in its list): extraction-model-type-list
(eagle3_model_types.py) lets it through.
How: `GraniteMoeHybridModel.forward` is replaced by ours (eagle3_aux.py says why it is a plain
function) and `GraniteMoeHybridForCausalLM` by a subclass with `SupportsEagle3`. Each decoder
layer returns the residual stream itself as its hidden states (`residual + out * multiplier`;
the residual it returns is only its post-attention input), so id i is that output of layer i-1,
id 0 the embeddings after `embedding_multiplier`: HF's `hidden_states[i]`. Without aux layers
the forward is vLLM's own computation, unchanged.
Upstream: none yet.
"""

from __future__ import annotations

from itertools import islice
from typing import Any

from speculators_hybrid.registry import Patch, Target
from speculators_hybrid.vllm_patches.eagle3_aux import add, eagle3_class, layers_of, replacing

MODULE = "vllm.model_executor.models.granitemoehybrid"


def granite_forward(
    self: Any,
    input_ids: Any,
    positions: Any,
    intermediate_tensors: Any = None,
    inputs_embeds: Any = None,
) -> Any:
    """vLLM's `GraniteMoeHybridModel.forward`, returning `(hidden, aux)` when aux ids are set."""
    from vllm.distributed.parallel_state import get_pp_group
    from vllm.sequence import IntermediateTensors

    pp = get_pp_group()
    if pp.is_first_rank:
        hidden = inputs_embeds if inputs_embeds is not None else self.embed_input_ids(input_ids)
        hidden = hidden * self.embedding_multiplier
        residual = None
    else:
        if intermediate_tensors is None:
            raise RuntimeError("Intermediate tensors may not be None!")
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
        add(aux, wanted, index, hidden)
    if not pp.is_last_rank:
        return IntermediateTensors({"hidden_states": hidden, "residual": residual})
    hidden = self.norm(hidden)
    return (hidden, aux) if aux else hidden


PATCH = Patch(
    id="granitemoehybrid-eagle3",
    project="vllm",
    versions=">=0.20",
    fixed_upstream="none yet",
    why=__doc__ or "",
    targets=(
        Target(
            MODULE,
            "GraniteMoeHybridModel.forward",
            replacing(granite_forward),
            (
                "499f387c8e071625",  # 0.20.0-0.33.0
                "8b128455ce0a6ef3",  # 0.34.0 (drops an unused layer index; same computation)
            ),
            replaces=True,
        ),
        Target(
            MODULE,
            "GraniteMoeHybridForCausalLM",
            eagle3_class,
            (
                "3fb8623a49c51053",  # 0.20.0-0.27.1
                "f724f161c9a280c7",  # 0.28.0
                "450f2d1c2f892f6e",  # 0.29.0-0.31.0
                "cfe9e909dcd6229c",  # 0.32.0
                "6fb07fc5e2a16271",  # 0.33.0-0.34.0
            ),
            replaces=True,
        ),
    ),
)
