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

# Special tokens of the local tokenizer: end-of-text is id 0, the vision specials take the last
# four ids (`models.config_dict` puts image/video/vision-start/vision-end at vocab-4 .. vocab-1).
EOS_TOKEN = "<|endoftext|>"
VISION_TOKENS = ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")


def tiny_config(multimodal: bool = True) -> Any:
    """The transformers config of the 'tiny' preset (speculators_hybrid.models)."""
    from speculators_hybrid.models import hf_config

    return hf_config("tiny", multimodal)


def write_tokenizer(folder: str | Path, vocab_size: int) -> None:
    """A byte-level BPE tokenizer with exactly `vocab_size` ids, saved as tokenizer.json.

    Byte-level (Qwen's scheme) because transformers 5 loads any `qwen3_5` folder with its own
    `Qwen3_5Tokenizer`, which rebuilds a byte-level BPE from the file's vocab and merges whatever
    `tokenizer_class` says. Ids: 0 `<|endoftext|>`, 1..256 the bytes, then merges of ASCII letter
    pairs ("ab", ...), then the four vision specials (ids vocab-4 .. vocab-1, as in the config).
    """
    from tokenizers import Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE

    letters = [chr(c) for c in [*range(97, 123), *range(65, 91)]]
    pairs = [(a, b) for a in letters for b in letters]
    n_merges = vocab_size - 1 - 256 - len(VISION_TOKENS)
    assert 0 <= n_merges <= len(pairs), vocab_size
    tokens = [
        EOS_TOKEN,
        *sorted(pre_tokenizers.ByteLevel.alphabet()),
        *(a + b for a, b in pairs[:n_merges]),
    ]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    tok = Tokenizer(BPE(vocab, pairs[:n_merges]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([EOS_TOKEN, *VISION_TOKENS])  # EOS keeps id 0; the rest get the last ids
    assert (
        tok.get_vocab_size() == vocab_size and tok.token_to_id(VISION_TOKENS[-1]) == vocab_size - 1
    )
    folder = Path(folder)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "TokenizersBackend",
                "eos_token": EOS_TOKEN,
                "pad_token": EOS_TOKEN,
                "unk_token": EOS_TOKEN,
                "model_max_length": 1 << 20,
            },
            indent=2,
        )
    )


def _text_model(model: torch.nn.Module) -> torch.nn.Module:
    """The decoder stack (`Qwen3_5TextModel`) of either layout."""
    inner = model.model
    return getattr(inner, "language_model", inner)


def build_tiny_model(folder: str | Path, multimodal: bool = True, seed: int = 0) -> Path:
    """Random-weight tiny Qwen3.5 hybrid (8 layers, GDN:attention 3:1): bf16 + tokenizer."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration

    from speculators_hybrid.models import save_random_model

    config = tiny_config(multimodal)
    cls = Qwen3_5ForConditionalGeneration if multimodal else Qwen3_5ForCausalLM
    # transformers' default init keeps the stream well-conditioned here (per-id rms 0.02-0.07,
    # tokens nearly orthogonal, each layer moves the stream: cos(id i, id i-1) 0.64-0.93), so
    # no rescaling; a bf16 forward stays within cos 0.9997 of fp32 on 1500 tokens.
    folder = save_random_model(folder, cls, config, seed)
    vocab = (config.text_config if multimodal else config).vocab_size
    write_tokenizer(folder, vocab)
    return folder


def reference_device() -> str:
    """ "cpu" unless transformers would pick GPU-only GDN kernels (`fla`, `causal_conv1d`).

    transformers uses those packages whenever they are importable, whatever the tensors' device;
    without them it runs its PyTorch reference path, exact float32 on the CPU (no TF32).
    """
    import importlib.util

    fast = any(importlib.util.find_spec(p) for p in ("fla", "causal_conv1d"))
    return "cuda" if fast and torch.cuda.is_available() else "cpu"


def load_model(folder: str | Path, device: str = "cpu") -> torch.nn.Module:
    """The saved model in float32 (its bf16 weights upcast exactly), eval mode."""
    from transformers import AutoConfig, Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration

    config = AutoConfig.from_pretrained(folder)
    cls = (
        Qwen3_5ForCausalLM
        if config.model_type == "qwen3_5_text"
        else Qwen3_5ForConditionalGeneration
    )
    return cls.from_pretrained(folder, dtype=torch.float32).to(device).eval()


@torch.no_grad()
def reference_hidden_states(
    folder: str | Path | torch.nn.Module,
    token_ids: list[int],
    layer_ids: list[int],
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
