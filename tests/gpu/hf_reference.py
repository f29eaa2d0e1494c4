"""HuggingFace side of the GPU proof: a tiny local Qwen3.5 hybrid and its files' verification.

Importable without a GPU or vLLM. Layer-id semantics (speculators' and vLLM's): id 0 is the
embeddings output (the input of decoder layer 0), id i (1..n) the residual stream after decoder
layer i-1; id n is therefore the final state BEFORE the final norm. The reference states and the
calibrated comparison are the package's own (`speculators_hybrid.verify`: forward hooks, since
transformers' `output_hidden_states` ends with the state after the final norm), so the GPU
tests hold vLLM's files to the same rule as `speculators-hybrid verify`.
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
    """The saved model in its checkpoint's dtype (bf16), eval mode: verify's own loader."""
    from speculators_hybrid.verify import capture

    return capture.load_model(folder, device)


def check_file(path: str | Path, prompt: list[int], layer_ids: list[int], model: Any) -> Any:
    """One hidden-states file: the contract is asserted (token ids = the prompt, shape, no
    all-zero rows), then `speculators-hybrid verify`'s check of it against `model` (loaded with
    `load_model`) under the calibrated rule; returns its `FileResult` (`.ok`, `.ids`, `.reasons`).
    """
    from safetensors.torch import load_file

    from speculators_hybrid.verify.files import Verifier

    data = load_file(str(path))
    assert {"hidden_states", "token_ids"} <= set(data), f"{path}: keys {sorted(data)}"
    tokens, hidden = data["token_ids"], data["hidden_states"]
    assert tokens.dtype == torch.int64, f"{path}: token_ids dtype {tokens.dtype}"
    assert tokens.tolist() == list(prompt), f"{path}: token_ids differ from the prompt"
    verifier = Verifier(model, ids=list(layer_ids))
    expected = (len(prompt), len(layer_ids), verifier.hidden)
    assert tuple(hidden.shape) == expected, f"{path}: shape {tuple(hidden.shape)} != {expected}"
    zero = (hidden == 0).all(dim=-1).nonzero().tolist()  # [token, slot] pairs that are all zero
    assert not zero, f"{path}: {len(zero)} all-zero (token, id-slot) rows, first {zero[:5]}"
    return verifier.verify(path)
