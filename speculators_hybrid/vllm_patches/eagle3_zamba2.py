"""EAGLE-3 auxiliary hidden states for Zamba2 (`Zamba2ForCausalLM`).

Why: vLLM's `Zamba2ForCausalLM` (`zamba2`: Mamba-2 layers, some of them "hybrid" layers that
first run one of a few shared attention + MLP blocks on [stream, embeddings] and add its
projected output into their Mamba input; Zyphra's Zamba2) has no `SupportsEagle3` in any release
0.20.0-0.34.0, so `extract_hidden_states` fails after loading the weights ("Model does not
support EAGLE3 interface"). On 0.20/0.21 vLLM's SpeculativeConfig also refuses the model type by
name (not in its list): extraction-model-type-list (eagle3_model_types.py) lets it through.
How: `Zamba2Model.forward` is replaced by ours (eagle3_aux.py says why it is a plain function)
and `Zamba2ForCausalLM` by a subclass with `SupportsEagle3`. Each entry of `Zamba2Model.layers`
(one per `layers_block_type` entry: a Mamba layer, or a hybrid layer whose shared block feeds
its Mamba layer) takes and returns the residual stream itself, so id i is the output of layer
i-1: the stream after hybrid-or-Mamba layer i-1, the shared block's output counted inside the
layer that uses it (it never enters the stream but through that layer's Mamba output), as
transformers' `output_hidden_states` counts them. Id 0 is a copy of the embeddings, id n the
last layer's output before `final_layernorm`. Zamba2 has no pipeline parallelism in vLLM (its
forward takes no intermediate tensors). Without aux layers the forward is vLLM's own
computation, unchanged.
Upstream: none yet.
"""

from __future__ import annotations

from typing import Any

from speculators_hybrid.registry import Patch, Target
from speculators_hybrid.vllm_patches.eagle3_aux import add, eagle3_class, layers_of, replacing

MODULE = "vllm.model_executor.models.zamba2"


def zamba2_forward(
    self: Any,
    input_ids: Any,
    positions: Any,
    inputs_embeds: Any = None,
) -> Any:
    """vLLM's `Zamba2Model.forward`, returning `(hidden, aux)` when aux ids are set."""
    if inputs_embeds is None:
        inputs_embeds = self.embed_input_ids(input_ids)
    hidden = inputs_embeds
    original = hidden.clone()  # the embeddings every shared block reads beside the stream
    wanted = layers_of(self)
    aux: list[Any] = []
    add(aux, wanted, 0, hidden)
    for index, layer in enumerate(self.layers, start=1):
        hidden = layer(hidden, original_hidden_states=original, positions=positions)
        add(aux, wanted, index, hidden)
    hidden = self.final_layernorm(hidden)
    return (hidden, aux) if aux else hidden


PATCH = Patch(
    id="zamba2-eagle3",
    project="vllm",
    versions=">=0.20",
    fixed_upstream="none yet",
    why=__doc__ or "",
    targets=(
        Target(
            MODULE,
            "Zamba2Model.forward",
            replacing(zamba2_forward),
            (
                "1faff73408f19828",  # 0.20.0-0.33.0
                "23d9d4b1a6db0320",  # 0.34.0 (drops an unused layer index; same computation)
            ),
            replaces=True,
        ),
        Target(
            MODULE,
            "Zamba2ForCausalLM",
            eagle3_class,
            (
                "9086260a9b7de733",  # 0.20.0-0.24.0
                "f1b215c603ac1374",  # 0.25.0-0.31.0
                "517a6026ac117442",  # 0.32.0
                "05d317db50b85ac8",  # 0.33.0-0.34.0
            ),
            replaces=True,
        ),
    ),
)
