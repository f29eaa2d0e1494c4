"""One engine of `speculators-hybrid accept`: serve a target with or without a drafter in vLLM.

Acceptance is read the way speculators' own end-to-end tests read it, from vLLM's metrics
(`LLM(..., disable_log_stats=False)`, then `LLM.get_metrics()`): acceptance at draft position i
is `vllm:spec_decode_num_accepted_tokens_per_pos[i] / vllm:spec_decode_num_drafts`, and the
acceptance length is `1 + vllm:spec_decode_num_accepted_tokens / vllm:spec_decode_num_drafts`.
Generation is greedy on held-out chats (the turns before the first assistant turn, then the
assistant's turn to come), a fixed number of tokens each (`ignore_eos`), so runs with and
without a drafter produce the same tokens and their decode rates compare: all prompts at once,
then a few one at a time. `past_end_share` says how much of that came after a reply's
end-of-turn token; `--stop-at-end` measures the replies alone.

    python -m speculators_hybrid.accept.engine TARGET HELDOUT.jsonl OUT.json \
        [--drafter DIR --method eagle3|dflash|mtp --k 3]

One engine per process (`accept` runs one per measurement); vLLM's own error, if the engine
cannot start, goes to OUT.json as `error` with exit 1.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROLES = {"human": "user", "user": "user", "system": "system", "gpt": "assistant"}


def opening(conv: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The turns before the first assistant turn, as role/content (speculators reads both
    `role`/`content` and ShareGPT's `from`/`value`)."""
    turns = []
    for turn in conv:
        role = ROLES.get(turn.get("role") or turn.get("from") or "", "assistant")
        if role == "assistant":
            break
        turns.append({"role": role, "content": turn.get("content") or turn.get("value") or ""})
    return turns


def prompts(heldout: Path, tokenizer: Any, count: int) -> list[str]:
    rows = [json.loads(line)["conversations"] for line in heldout.open() if line.strip()]
    step = max(len(rows) // count, 1)
    picked = [turns for conv in rows[::step] if (turns := opening(conv))][:count]
    return [
        tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=False)
        for turns in picked
    ]


def counts(metrics: list[Any]) -> dict[str, Any]:
    """vLLM's speculative-decoding counters, summed over engines."""
    out: dict[str, Any] = {"drafts": 0.0, "draft_tokens": 0.0, "accepted": 0.0, "per_pos": []}
    names = {
        "vllm:spec_decode_num_drafts": "drafts",
        "vllm:spec_decode_num_draft_tokens": "draft_tokens",
        "vllm:spec_decode_num_accepted_tokens": "accepted",
    }
    for m in metrics:
        if m.name in names:
            out[names[m.name]] += m.value
        elif m.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            per_pos = out["per_pos"]
            per_pos += [0.0] * (len(m.values) - len(per_pos))
            for i, v in enumerate(m.values):
                per_pos[i] += v
    return out


def acceptance(now: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    """Acceptance of the drafts made between two readings of the counters."""
    drafts = now["drafts"] - before["drafts"]
    accepted = now["accepted"] - before["accepted"]
    old = before["per_pos"] + [0.0] * (len(now["per_pos"]) - len(before["per_pos"]))
    per_pos = [a - b for a, b in zip(now["per_pos"], old, strict=True)]
    return {
        "num_drafts": drafts,
        "num_draft_tokens": now["draft_tokens"] - before["draft_tokens"],
        "num_accepted_tokens": accepted,
        "acceptance_per_position": [round(v / drafts, 4) for v in per_pos] if drafts else [],
        "acceptance_length": round(1 + accepted / drafts, 4) if drafts else None,
    }


def past_end(outputs: list[list[int]], ends: set[int]) -> float | None:
    """The share of generated tokens that come after their output's first end-of-turn token:
    text neither the target nor a drafter was trained on (generation ignores the end so that
    every engine makes the same number of tokens)."""
    total = sum(len(ids) for ids in outputs)
    after = 0
    for ids in outputs:
        first = next((i for i, t in enumerate(ids) if t in ends), len(ids) - 1)
        after += len(ids) - 1 - first
    return round(after / total, 4) if total else None


def end_ids(tokenizer: Any) -> set[int]:
    """The tokenizer's end of sequence and, where it has one, the chat end-of-turn token."""
    ends = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(turn, int) and turn != tokenizer.unk_token_id:
        ends.add(turn)
    return ends


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", type=Path)
    parser.add_argument("heldout", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--drafter", type=Path)
    parser.add_argument("--method", default="eagle3")
    parser.add_argument("--k", type=int, default=3, help="draft tokens a step")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--serial", type=int, default=8, help="prompts then run one at a time")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--eager", action="store_true", help="no CUDA graphs")
    parser.add_argument(
        "--stop-at-end",
        action="store_true",
        help="stop each reply at its end-of-turn token (default: --max-tokens each)",
    )
    parser.add_argument(
        "--gpu-memory-utilization", type=float, default=0.3, help="lower when engines share a GPU"
    )
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--kv-cache-gib", type=float, default=4.0)
    args = parser.parse_args(argv)
    report: dict[str, Any] = {
        "target": str(args.target),
        "drafter": str(args.drafter) if args.drafter else None,
        "method": args.method if args.drafter else None,
        "k": args.k if args.drafter else 0,
        "max_tokens": args.max_tokens,
        "cuda_graphs": not args.eager,
        "stop_at_end": args.stop_at_end,
    }
    engine: dict[str, Any] = dict(
        model=str(args.target),
        max_model_len=args.max_model_len,
        max_num_seqs=64,
        kv_cache_memory_bytes=int(args.kv_cache_gib * (1 << 30)),
        gpu_memory_utilization=args.gpu_memory_utilization,
        enforce_eager=args.eager,
        disable_log_stats=False,
        gdn_prefill_backend="triton",
        seed=0,
    )
    if not args.eager:
        engine["compilation_config"] = {"cudagraph_capture_sizes": [1, 2, 4, 8, 16, 32, 64]}
    if args.drafter:
        engine["speculative_config"] = {
            "method": args.method,
            "model": str(args.drafter),
            "num_speculative_tokens": args.k,
        }
    try:
        from transformers import AutoTokenizer
        from vllm import LLM, SamplingParams

        tokenizer = AutoTokenizer.from_pretrained(args.target)
        texts = prompts(args.heldout, tokenizer, args.prompts)
        report["prompts"] = len(texts)
        start = time.time()
        llm = LLM(**engine)
        report["engine_start_s"] = round(time.time() - start, 1)
    except Exception as exc:  # noqa: BLE001  (the finding is the error itself)
        report["error"] = f"{type(exc).__name__}: {exc}"
        report["traceback_tail"] = traceback.format_exc()[-3000:]
        args.out.write_text(json.dumps(report, indent=2))
        print("accept:", report["error"], file=sys.stderr)
        return 1
    params = SamplingParams(
        temperature=0.0, max_tokens=args.max_tokens, ignore_eos=not args.stop_at_end
    )
    llm.generate(texts[:4], params, use_tqdm=False)  # warm-up, outside the timings and metrics
    warm = counts(llm.get_metrics())
    start = time.time()
    outs = llm.generate(texts, params, use_tqdm=False)
    batch_s = time.time() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    start = time.time()
    serial_tokens = 0
    for text in texts[: args.serial]:
        out = llm.generate([text], params, use_tqdm=False)
        serial_tokens += len(out[0].outputs[0].token_ids)
    serial_s = time.time() - start
    spec = acceptance(counts(llm.get_metrics()), warm)
    report.update(
        spec,
        batch_tok_s=round(tokens / batch_s, 1),
        serial_tok_s=round(serial_tokens / serial_s, 1),
        output_tokens=tokens,
        past_end_share=past_end([list(o.outputs[0].token_ids) for o in outs], end_ids(tokenizer)),
        outputs_head=[o.outputs[0].token_ids[:16] for o in outs[:4]],
    )
    args.out.write_text(json.dumps(report, indent=2))
    print("accept:", json.dumps({k: v for k, v in report.items() if k != "outputs_head"}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
