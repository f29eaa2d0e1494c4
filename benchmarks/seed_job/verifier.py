"""The seed job's verifier folder and chats, made offline (no hub, no real weights).

`write_verifier(folder, preset)` writes what the seed job's processes read of Qwen3.6-27B:

- `config.json`: the preset's config (`speculators_hybrid.models`; `qwen3.6-27b` is the published
  config's text model); vLLM runs it with `--load-format dummy`, so it reads no weights;
- a tokenizer with a chat template: the byte-level BPE of `benchmarks/acceptance/target.py`
  (4,096 ids, trained on the Python standard library's source). The real Qwen3.6 tokenizer is
  not available offline; every id of this one lies inside the real 248,320-id vocabulary, so
  the embedding rows the trainer looks up exist; its text is split into more tokens than the
  real tokenizer would make of it, which does not matter here: lengths are counted in its tokens;
- `model-00001-of-00001.safetensors` and `model.safetensors.index.json`, holding only what
  speculators' trainer reads of the verifier for DFlash (`load_model_layers` in 0.9.0: the
  embeddings, lm_head and the final norm, found by name suffix through the index), under the
  names a Qwen3.5/3.6 checkpoint uses, real shapes, random bf16 values.

`make_chats(tokenizer, n, lo, hi)` cuts chats out of the standard library's source whose rendered
length (chat template included, in the tokenizer's tokens) is uniform over the integers
[lo, hi]: the seed job's 1,000-2,000 tokens a sample by default.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.acceptance import target  # noqa: E402
from speculators_hybrid.models import config_dict  # noqa: E402

SHARD = "model-00001-of-00001.safetensors"
INDEX = "model.safetensors.index.json"
TOKENIZER_VOCAB = 4096
TEXT_CHARS = 3_000_000  # of stdlib source the chats are cut from


def verifier_tensors(preset: str) -> dict[str, tuple[int, ...]]:
    """The tensors the trainer reads of the verifier, named as in a Qwen3.5/3.6 checkpoint."""
    text = config_dict(preset)["text_config"]
    vocab, hidden = text["vocab_size"], text["hidden_size"]
    return {
        "model.language_model.embed_tokens.weight": (vocab, hidden),
        "lm_head.weight": (vocab, hidden),
        "model.language_model.norm.weight": (hidden,),
    }


def stdlib_files(limit: int) -> list[Path]:
    return target.source_files(limit)[0]


def write_verifier(folder: Path, preset: str, files: int = 400, seed: int = 0) -> dict[str, Any]:
    """config.json, tokenizer + chat template, and the trainer's tensors; returns a summary."""
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    target.write_tokenizer(folder, stdlib_files(files), TOKENIZER_VOCAB)
    raw = config_dict(preset)
    tok = json.loads((folder / "tokenizer.json").read_text())["added_tokens"]
    ids = {t["content"]: t["id"] for t in tok}
    eos, pad = ids[target.IM_END], ids[target.EOS]
    raw["text_config"].update(eos_token_id=eos, pad_token_id=pad, bos_token_id=None)
    raw["eos_token_id"] = eos
    (folder / "config.json").write_text(json.dumps(raw, indent=2))
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, shape in verifier_tensors(preset).items():
        values = torch.randn(shape, generator=gen)
        tensors[name] = values.mul_(0.02).to(torch.bfloat16)
    save_file(tensors, str(folder / SHARD), metadata={"format": "pt"})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict.fromkeys(tensors, SHARD)}
    (folder / INDEX).write_text(json.dumps(index, indent=2))
    return {"preset": preset, "tensors": verifier_tensors(preset), "bytes": total}


def token_stream(tokenizer: Any, files: list[Path], chars: int = TEXT_CHARS) -> list[int]:
    text, size = [], 0
    for path in files:
        text.append(target.read(path))
        size += len(text[-1])
        if size >= chars:
            break
    return tokenizer("\n".join(text), add_special_tokens=False)["input_ids"]


def rendered_length(tokenizer: Any, conv: list[dict[str, str]]) -> int:
    text = tokenizer.apply_chat_template(conv, tokenize=False)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def make_chats(
    tokenizer: Any, stream: list[int], n: int, lo: int = 1000, hi: int = 2000, seed: int = 0
) -> tuple[list[list[dict[str, str]]], list[int]]:
    """n (user, assistant) chats of `stream`'s text, each rendered to exactly a length drawn
    uniformly from [lo, hi] (a quarter user, the rest assistant); returns (chats, lengths)."""
    rng = random.Random(seed)
    chats, lengths = [], []
    for _ in range(n):
        want = rng.randint(lo, hi)
        start = rng.randrange(0, max(len(stream) - 2 * hi, 1))
        user = max(want // 4, 1)
        reply = want - user
        for _ in range(8):  # BPE may merge across the cut: correct until exact
            conv = [
                {"role": "user", "content": tokenizer.decode(stream[start : start + user])},
                {
                    "role": "assistant",
                    "content": tokenizer.decode(stream[start + user : start + user + reply]),
                },
            ]
            got = rendered_length(tokenizer, conv)
            if got == want:
                break
            reply = max(reply + want - got, 1)
        chats.append(conv)
        lengths.append(got)
    return chats, lengths


def write_chats(folder: Path, out: Path, n: int, lo: int, hi: int, seed: int = 0) -> dict:
    """`out` (speculators' `conversations` jsonl) and the realized length distribution."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    stream = token_stream(tokenizer, stdlib_files(0))
    chats, lengths = make_chats(tokenizer, stream, n, lo, hi, seed)
    with out.open("w") as f:
        for conv in chats:
            f.write(json.dumps({"conversations": conv}) + "\n")
    return length_stats(lengths, lo, hi)


def length_stats(lengths: list[int], lo: int, hi: int) -> dict[str, Any]:
    ordered = sorted(lengths)
    return {
        "distribution": f"uniform over the integers [{lo}, {hi}], rendered with the chat template",
        "samples": len(lengths),
        "tokens": sum(lengths),
        "mean": round(sum(lengths) / max(len(lengths), 1), 1),
        "min": ordered[0] if ordered else None,
        "median": ordered[len(ordered) // 2] if ordered else None,
        "max": ordered[-1] if ordered else None,
        "exact": sum(lo <= x <= hi for x in lengths),
    }
