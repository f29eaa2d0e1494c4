"""HuggingFace side of the GPU proof: a tiny local Qwen3.5 hybrid and its reference hidden states.

Importable without a GPU or vLLM. Layer-id semantics (speculators' and vLLM's): id 0 is the
embeddings output (the input of decoder layer 0), id i (1..n) the residual stream after decoder
layer i-1; id n is therefore the final state BEFORE the final norm. transformers' own
`output_hidden_states` is not used for the reference because its last entry is the state AFTER
the final norm (`capture_outputs(tie_last_hidden_states=True)` replaces it with
`last_hidden_state`; checked with transformers 5.24): the hooks below capture the pre-norm one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

# Token ids of the local tokenizer: 0 is end-of-text, the last four are the vision specials
# (`models.config_dict` puts image/video/vision-start/vision-end at vocab-4 .. vocab-1).
EOS_TOKEN = "<|endoftext|>"
VISION_TOKENS = ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")


def _fit_mrope(text: dict[str, Any]) -> None:
    """Resize `mrope_section` to the rotary width: vLLM asserts sum == rotary_dim // 2.

    The presets copy Qwen3.5's [11, 11, 10] (for head_dim 256); the tiny head_dim 64 with
    partial_rotary_factor 0.25 rotates 16 dims, i.e. 8 frequencies. Text-only positions are
    equal in all three sections, so the split does not change any value.
    """
    rope = text["rope_parameters"]
    half = int(text["head_dim"] * rope.get("partial_rotary_factor", 1.0)) // 2
    section = list(rope["mrope_section"])
    total = sum(section)
    if total == half:
        return
    fitted = [s * half // total for s in section]
    for i in range(half - sum(fitted)):
        fitted[i % len(fitted)] += 1
    rope["mrope_section"] = fitted


def tiny_config(multimodal: bool = True) -> Any:
    """The transformers config of the 'tiny' preset (speculators_hybrid.models)."""
    from transformers import Qwen3_5Config, Qwen3_5TextConfig

    from speculators_hybrid.models import config_dict

    raw = config_dict("tiny", multimodal)
    text = raw["text_config"] if multimodal else raw
    _fit_mrope(text)
    text.update(eos_token_id=0, pad_token_id=0, bos_token_id=None)
    if not multimodal:
        return Qwen3_5TextConfig(**raw)
    return Qwen3_5Config(**raw)


def write_tokenizer(folder: str | Path, vocab_size: int) -> None:
    """A WordLevel tokenizer: `<|endoftext|>`=0, `w1`..`w{V-5}`, then the four vision specials."""
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers.models import WordLevel

    words = [f"w{i}" for i in range(1, vocab_size - len(VISION_TOKENS))]
    vocab = {tok: i for i, tok in enumerate([EOS_TOKEN, *words, *VISION_TOKENS])}
    assert len(vocab) == vocab_size
    tok = Tokenizer(WordLevel(vocab, unk_token=EOS_TOKEN))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([EOS_TOKEN, *VISION_TOKENS])
    folder = Path(folder)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOS_TOKEN, "pad_token": EOS_TOKEN, "unk_token": EOS_TOKEN,
        "model_max_length": 1 << 20,
    }, indent=2))


def _text_model(model: torch.nn.Module) -> torch.nn.Module:
    """The decoder stack (`Qwen3_5TextModel`) of either layout."""
    inner = model.model
    return getattr(inner, "language_model", inner)


@torch.no_grad()
def _condition(model: torch.nn.Module) -> None:
    """Keep every layer's update a visible, bounded part of the residual stream.

    Default init (std 0.02) leaves token embeddings ~0.02 per element while each layer adds
    ~0.1-0.3: fine already, but scale the embeddings up so id 0/1 are not swamped by a single
    layer's bias, and shrink the output projections so no layer dominates the stream.
    """
    text = _text_model(model)
    text.embed_tokens.weight.mul_(25.0)  # ~0.5 per element
    for layer in text.layers:
        mixer = getattr(layer, "linear_attn", None) or layer.self_attn
        out = getattr(mixer, "out_proj", None) or mixer.o_proj
        out.weight.mul_(0.5)
        layer.mlp.down_proj.weight.mul_(0.5)


def build_tiny_model(folder: str | Path, multimodal: bool = True, seed: int = 0) -> Path:
    """Random-weight tiny Qwen3.5 hybrid (8 layers, GDN:attention 3:1), bf16 safetensors + tokenizer."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = tiny_config(multimodal)
    torch.manual_seed(seed)
    cls = Qwen3_5ForConditionalGeneration if multimodal else Qwen3_5ForCausalLM
    model = cls(config).eval()
    _condition(model)
    model = model.to(torch.bfloat16)
    model.config.dtype = torch.bfloat16  # written as "dtype": "bfloat16"
    model.save_pretrained(folder, safe_serialization=True)
    vocab = (config.text_config if multimodal else config).vocab_size
    write_tokenizer(folder, vocab)
    return folder


def load_model(folder: str | Path, device: str = "cpu") -> torch.nn.Module:
    """The saved model in float32 (its bf16 weights upcast exactly), eval mode."""
    from transformers import AutoConfig, Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration

    config = AutoConfig.from_pretrained(folder)
    cls = Qwen3_5ForCausalLM if config.model_type == "qwen3_5_text" else Qwen3_5ForConditionalGeneration
    return cls.from_pretrained(folder, dtype=torch.float32).to(device).eval()


@torch.no_grad()
def reference_hidden_states(
    folder: str | Path | torch.nn.Module, token_ids: list[int], layer_ids: list[int],
    device: str = "cpu",
) -> torch.Tensor:
    """[T, len(layer_ids), hidden] float32: one HF forward, no cache, residual stream by id.

    `folder` may also be an already loaded model (see `load_model`), to load once per test.
    """
    model = folder if isinstance(folder, torch.nn.Module) else load_model(folder, device)
    layers = _text_model(model).layers
    n = len(layers)
    if not all(0 <= i <= n for i in layer_ids):
        raise ValueError(f"layer ids must be in 0..{n}: {layer_ids}")
    states: dict[int, torch.Tensor] = {}

    def before_first(module: Any, args: tuple, kwargs: dict) -> None:
        states[0] = args[0] if args else kwargs["hidden_states"]

    def after(i: int) -> Any:
        def hook(module: Any, args: Any, output: Any) -> None:
            states[i + 1] = output[0] if isinstance(output, tuple) else output
        return hook

    handles = [layers[0].register_forward_pre_hook(before_first, with_kwargs=True)]
    handles += [layer.register_forward_hook(after(i)) for i, layer in enumerate(layers)]
    try:
        dev = next(model.parameters()).device
        model(input_ids=torch.tensor([token_ids], device=dev), use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return torch.stack([states[i][0].float().cpu() for i in layer_ids], dim=1)


def cosine_per_token(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Cosine similarity along the last dim, in float32: [..., hidden] x2 -> [...]."""
    return torch.nn.functional.cosine_similarity(a.float(), b.float(), dim=-1, eps=1e-12)


def check_file(
    path: str | Path, prompt: list[int], layer_ids: list[int], reference: torch.Tensor
) -> dict[int, float]:
    """Validate one hidden-states file against the contract; return min cosine per layer id."""
    from safetensors.torch import load_file

    data = load_file(str(path))
    assert {"hidden_states", "token_ids"} <= set(data), f"{path}: keys {sorted(data)}"
    tokens, hidden = data["token_ids"], data["hidden_states"]
    assert tokens.dtype == torch.int64, f"{path}: token_ids dtype {tokens.dtype}"
    assert tokens.tolist() == list(prompt), f"{path}: token_ids differ from the prompt"
    expected = (len(prompt), len(layer_ids), reference.shape[-1])
    assert tuple(hidden.shape) == expected, f"{path}: shape {tuple(hidden.shape)} != {expected}"
    zero = (hidden == 0).all(dim=-1).nonzero().tolist()  # [token, slot] pairs that are all zero
    assert not zero, f"{path}: {len(zero)} all-zero (token, id-slot) rows, first {zero[:5]}"
    cos = cosine_per_token(hidden, reference)  # [T, len(ids)]
    return {i: float(cos[:, k].min()) for k, i in enumerate(layer_ids)}
