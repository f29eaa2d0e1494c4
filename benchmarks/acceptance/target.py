"""A small hybrid target with real structure: a Qwen3.5-style model trained on Python's own source.

Drafters are judged by acceptance, which means nothing on a random target: a drafter can only
learn what the target predicts. This script makes a target that predicts something, offline, in
a few minutes of GPU time:

1. the corpus is the standard library's source of the Python running it (`*.py` under
   `sysconfig`'s stdlib, site-packages left out), split by file: about one file in ten, chosen by
   a hash of its path, is held out for evaluation and for the acceptance prompts;
2. a byte-level BPE tokenizer (`tokenizers`) is trained on the training files, with the chat
   specials and the four vision specials Qwen3.5's config names;
3. every file is cut into chats, the user turn a block of lines and the assistant turn the lines
   that follow, written with the checkpoint's own chat template;
4. the `stdlib-tiny` preset (`speculators_hybrid.models`: Gated DeltaNet and full attention
   3:1, the Qwen3.5 multimodal layout that vLLM 0.20 serves) is trained on those chats in bf16
   autocast for `--seconds`, then the held-out loss and perplexity are measured and written to
   `target.json` beside the checkpoint.

The folder it writes is a complete checkpoint: weights, tokenizer, chat template and the image
and video processor configs speculators' `AutoProcessor` reads. `chats.jsonl` (training) and
`heldout.jsonl` (held-out) hold the same chats in speculators' `conversations` format.

    python benchmarks/acceptance/target.py OUT [--seconds 180] [--device cuda]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from speculators_hybrid.models import PRESETS, config_dict, write_chat_files  # noqa: E402

PRESET = "stdlib-tiny"
EOS, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
VISION = ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")
USER_LINES, REPLY_LINES = 12, 16
SEQ = 512
HELD_OUT_EVERY = 10


def held_out(path: Path, root: Path) -> bool:
    digest = hashlib.sha256(str(path.relative_to(root)).encode()).digest()
    return digest[0] % HELD_OUT_EVERY == 0


def source_files(limit: int = 0) -> tuple[list[Path], list[Path]]:
    """The stdlib's `*.py` files, (train, held out); with `limit`, the first `limit` training
    files and a tenth as many held-out ones (at least one), in path order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)
    train = [p for p in files if not held_out(p, root)]
    test = [p for p in files if held_out(p, root)]
    if limit:
        train, test = train[:limit], test[: max(limit // HELD_OUT_EVERY, 1)]
    return train, test


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace").replace("\r\n", "\n")


def chats(files: list[Path]) -> list[list[dict[str, str]]]:
    """Each file as consecutive (user, assistant) blocks of lines; blank blocks skipped."""
    out = []
    for path in files:
        lines = read(path).split("\n")
        step = USER_LINES + REPLY_LINES
        for i in range(0, max(len(lines) - step + 1, 1), step):
            user = "\n".join(lines[i : i + USER_LINES])
            reply = "\n".join(lines[i + USER_LINES : i + step])
            if user.strip() and reply.strip():
                out.append(
                    [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
                )
    return out


def write_tokenizer(folder: Path, files: list[Path], vocab_size: int) -> None:
    """Byte-level BPE trained on `files`: ids 0-2 end-of-text and the chat marks, the vision
    specials the last four ids (where the preset's config puts them)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(VISION),
        special_tokens=[EOS, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator((read(p) for p in files), trainer=trainer)
    tok.add_special_tokens([*VISION])
    assert tok.get_vocab_size() == vocab_size, tok.get_vocab_size()
    assert tok.token_to_id(VISION[-1]) == vocab_size - 1
    tok.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "TokenizersBackend",
        "eos_token": IM_END,
        "pad_token": EOS,
        "unk_token": EOS,
        "model_max_length": 1 << 20,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    write_chat_files(folder)


def hf_config(tokenizer: Any) -> Any:
    from transformers import Qwen3_5Config

    raw = config_dict(PRESET)
    eos, pad = tokenizer.convert_tokens_to_ids([IM_END, EOS])
    raw["text_config"].update(eos_token_id=eos, pad_token_id=pad, bos_token_id=None)
    raw["eos_token_id"] = eos
    return Qwen3_5Config(**raw)


def encode(tokenizer: Any, conversations: list[list[dict[str, str]]]) -> list[list[int]]:
    texts = tokenizer.apply_chat_template(conversations, tokenize=False)
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    return [row[:SEQ] for row in ids]


def batches(rows: list[list[int]], size: int, pad: int, rng: random.Random, device: str):

    order = list(range(len(rows)))
    while True:
        rng.shuffle(order)
        for i in range(0, len(order) - size + 1, size):
            picked = [rows[j] for j in order[i : i + size]]
            yield pack(picked, pad, device)


def pack(picked: list[list[int]], pad: int, device: str):
    import torch

    width = max(len(r) for r in picked)
    ids = torch.full((len(picked), width), pad, dtype=torch.long)
    labels = torch.full((len(picked), width), -100, dtype=torch.long)
    for k, r in enumerate(picked):
        ids[k, : len(r)] = torch.tensor(r)
        labels[k, : len(r)] = torch.tensor(r)
    return ids.to(device), labels.to(device)


def heldout_loss(model: Any, rows: list[list[int]], pad: int, device: str, size: int) -> float:
    import torch

    total, count = 0.0, 0
    with torch.no_grad(), torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16):
        for i in range(0, len(rows), size):
            ids, labels = pack(rows[i : i + size], pad, device)
            logits = model(input_ids=ids).logits.float()
            loss = torch.nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, logits.shape[-1]),
                labels[:, 1:].reshape(-1),
                ignore_index=-100,
                reduction="sum",
            )
            total += loss.item()
            count += int((labels[:, 1:] != -100).sum())
    return total / max(count, 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder for the checkpoint (made; must not exist)")
    parser.add_argument("--seconds", type=float, default=180.0, help="training time budget")
    parser.add_argument("--max-steps", type=int, default=0, help="stop after this many steps")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-chats", type=int, default=512, help="held-out chats to score")
    parser.add_argument("--limit-files", type=int, default=0, help="use only the first N files")
    args = parser.parse_args(argv)
    if args.out.exists():
        print(f"target: {args.out} exists; pass a new folder", file=sys.stderr)
        return 2

    import torch
    from transformers import AutoTokenizer, Qwen3_5ForConditionalGeneration

    t0 = time.time()
    rng = random.Random(args.seed)
    torch.manual_seed(args.seed)
    train_files, test_files = source_files(args.limit_files)
    args.out.mkdir(parents=True)
    vocab = PRESETS[PRESET]["vocab_size"]
    write_tokenizer(args.out, train_files, vocab)
    tokenizer = AutoTokenizer.from_pretrained(args.out)
    train_chats, test_chats = chats(train_files), chats(test_files)
    for name, rows in (("chats.jsonl", train_chats), ("heldout.jsonl", test_chats)):
        with (args.out / name).open("w") as f:
            for conv in rows:
                f.write(json.dumps({"conversations": conv}) + "\n")
    train_ids = encode(tokenizer, train_chats)
    rng_eval = random.Random(1)
    eval_ids = encode(tokenizer, rng_eval.sample(test_chats, min(args.eval_chats, len(test_chats))))
    prep_s = time.time() - t0

    config = hf_config(tokenizer)
    model = Qwen3_5ForConditionalGeneration(config).to(args.device)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    warmup = 100
    pad = tokenizer.convert_tokens_to_ids(EOS)
    before = heldout_loss(model, eval_ids[:64], pad, args.device, args.batch)
    start, step, losses = time.time(), 0, []
    kind = args.device.split(":")[0]
    for ids, labels in batches(train_ids, args.batch, pad, rng, args.device):
        elapsed = time.time() - start
        if elapsed > args.seconds or (args.max_steps and step >= args.max_steps):
            break
        frac = min(elapsed / args.seconds, 1.0)
        lr = (
            args.lr
            * min(1.0, (step + 1) / warmup)
            * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        )
        for group in opt.param_groups:
            group["lr"] = lr
        with torch.autocast(device_type=kind, dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        step += 1
        if step % 50 == 0:
            print(
                f"target: step {step} loss {sum(losses[-50:]) / 50:.3f} {elapsed:.0f} s", flush=True
            )
    train_s = time.time() - start
    model.eval()
    held = heldout_loss(model, eval_ids, pad, args.device, args.batch)
    model = model.to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    model.save_pretrained(args.out, safe_serialization=True)
    tokens = sum(len(r) for r in train_ids)
    report = {
        "preset": PRESET,
        "parameters": params,
        "python_stdlib": sysconfig.get_paths()["stdlib"],
        "files": {"train": len(train_files), "held_out": len(test_files)},
        "chats": {"train": len(train_chats), "held_out": len(test_chats)},
        "train_tokens": tokens,
        "steps": step,
        "batch": args.batch,
        "tokens_seen": step * args.batch * SEQ,
        "epochs_approx": round(step * args.batch / max(len(train_ids), 1), 2),
        "train_loss_last_50": round(sum(losses[-50:]) / max(len(losses[-50:]), 1), 4),
        "heldout_loss_random_init": round(before, 4),
        "heldout_loss": round(held, 4),
        "heldout_perplexity": round(math.exp(held), 3),
        "eval_chats": len(eval_ids),
        "seconds": {"prepare": round(prep_s, 1), "train": round(train_s, 1)},
        "device": torch.cuda.get_device_name() if kind == "cuda" else kind,
    }
    (args.out / "target.json").write_text(json.dumps(report, indent=2))
    print("target:", json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
