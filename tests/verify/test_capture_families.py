"""verify's capture on the other hybrid families' layouts (issue 19): Nemotron-H keeps its
embeddings and final norm as `embeddings` / `norm_f`, Granite 4.0-H scales its embeddings.
A bf16 checkpoint captured in float32 must run every block in float32 (a block left in bf16
would feed bf16 into float32 weights) and give id 0 = the input of decoder layer 0."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    import torch
else:
    torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from speculators_hybrid.verify import capture  # noqa: E402

NEMOTRON_H = dict(
    num_hidden_layers=4,
    hybrid_override_pattern="M*M-",
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    mamba_num_heads=8,
    mamba_head_dim=16,
    n_groups=1,
    ssm_state_size=16,
    conv_kernel=4,
    expand=2,
    chunk_size=64,
    mlp_hidden_act="relu2",
    vocab_size=128,
)
GRANITE = dict(
    num_hidden_layers=4,
    layer_types=["mamba", "attention", "mamba", "mamba"],
    hidden_size=64,
    intermediate_size=128,
    shared_intermediate_size=128,
    num_local_experts=0,
    num_experts_per_tok=0,
    num_attention_heads=4,
    num_key_value_heads=2,
    mamba_n_heads=8,
    mamba_d_head=16,
    mamba_n_groups=1,
    mamba_d_state=16,
    mamba_d_conv=4,
    mamba_expand=2,
    mamba_chunk_size=64,
    embedding_multiplier=12.0,
    vocab_size=128,
)


def _model(model_type: str, body: dict) -> torch.nn.Module:
    try:
        config = transformers.AutoConfig.for_model(model_type, **body)
        model = transformers.AutoModelForCausalLM.from_config(config)
    except (ValueError, KeyError) as exc:  # this transformers lacks the family
        pytest.skip(f"transformers {transformers.__version__}: {exc}")
    torch.manual_seed(0)
    for p in model.parameters():
        p.data.normal_(0, 0.05)
    return model.to(torch.bfloat16).eval()


@pytest.mark.parametrize(
    ("model_type", "body"), [("nemotron_h", NEMOTRON_H), ("granitemoehybrid", GRANITE)]
)
def test_float32_capture_of_a_bf16_checkpoint(model_type: str, body: dict) -> None:
    model = _model(model_type, body)
    tokens = list(range(1, 41))
    stack = capture.decoder_stack(model)
    blocks = capture._blocks(model)
    assert blocks[0] is (getattr(stack, "embed_tokens", None) or stack.embeddings)
    assert blocks[-1] is (getattr(stack, "norm", None) or stack.norm_f)

    states = capture.hidden_states(model, tokens, [0, 1, 4], dtype=torch.float32)
    assert states.dtype == torch.float32 and states.shape == (40, 3, 64)
    embedded = blocks[0](torch.tensor(tokens)).float() * body.get("embedding_multiplier", 1.0)
    torch.testing.assert_close(states[:, 0], embedded, rtol=1e-6, atol=1e-6)
    assert next(model.parameters()).dtype == torch.bfloat16  # the checkpoint's own dtype back
    low = capture.hidden_states(model, tokens, [4])
    cos = torch.nn.functional.cosine_similarity(low[:, 0].float(), states[:, 2], dim=-1)
    assert cos.min() > 0.98, cos.min()
