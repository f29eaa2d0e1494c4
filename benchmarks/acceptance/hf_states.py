"""Reference hidden states: the prepared samples' states computed by transformers, as files
speculators' trainer reads offline.

For each sample i of the dataset `prepare-data` wrote (DATA, `datasets.load_from_disk`), one
forward of the target in transformers (float32 by default, each block cast just before it runs:
`speculators_hybrid.verify.capture`, the states `verify` holds vLLM's files to) gives the
residual stream at the trainer's layer ids plus the last layer (`--target-layer-ids 2 4 5` on a
target of 8 layers: ids 2, 4, 5, 8, as speculators' launcher asks vLLM for them). They are
written as `OUT/hs_<i>.safetensors`, `hidden_states` [tokens, ids, hidden] in `--dtype` and
`token_ids` (int64), the file our connector writes for the same request, so
`speculators train --hidden-states-path OUT --on-missing raise` trains from them.

With `--shuffle` the rows (token positions) of each file's `hidden_states` are permuted, all ids
alike, seeded by `--seed` and the sample index; `token_ids` stay in order. A drafter trained on
those learns nothing about the tokens: the control that acceptance must stay well below.
`--shuffled-copy DIR` writes that control beside the plain files from the same forward.

`--workers N` splits the samples over N processes (sample i to worker i % N), each with its own
copy of the model: one forward at a time leaves the GPU mostly idle (3,628 samples took 209 s
in one process on an H100, 2026-12-07).

    python benchmarks/acceptance/hf_states.py TARGET DATA OUT [--target-layer-ids 2 4 5]
        [--dtype float32|bfloat16] [--shuffle] [--shuffled-copy DIR] [--seed 0] [--device cuda]
        [--workers 1]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SPECULATORS_AUX_IDS = (2, 4, 5)  # loop.sh's --target-layer-ids


def permutation(tokens: int, seed: int, index: int) -> Any:
    """The row order of sample `index`'s shuffled file: the same on every run and machine."""
    import torch

    gen = torch.Generator().manual_seed(seed * 1_000_003 + index)
    return torch.randperm(tokens, generator=gen)


def metadata(target: Path, layer_ids: list[int], dtype: str, shuffle_seed: int | None) -> dict:
    return {
        "writer": "benchmarks/acceptance/hf_states.py (transformers)",
        "layer_ids": json.dumps(layer_ids),
        "model": str(target),
        "dtype": dtype,
        "shuffled_rows_seed": "none" if shuffle_seed is None else str(shuffle_seed),
    }


def write(folder: Path, index: int, hidden: Any, token_ids: Any, meta: dict[str, str]) -> None:
    from speculators_hybrid.vllm_patches.provenance_meta import save_whole

    tensors = {"hidden_states": hidden.contiguous(), "token_ids": token_ids}
    save_whole(str(folder / f"hs_{index}.safetensors"), tensors, meta)


def fail(message: str) -> int:
    print(f"hf_states: {message}", file=sys.stderr)
    return 2


def shard(args: argparse.Namespace, worker: int) -> dict[str, Any] | str:
    """Worker `worker` of args.workers: writes samples i with i % workers == worker; returns
    its counts, or an error line."""
    import datasets
    import torch

    from speculators_hybrid.extraction import id_problems
    from speculators_hybrid.verify import capture

    # float32 means float32: no TF32 in matmuls or in the GDN layers' convolutions
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dtype = capture.DTYPES[args.dtype]
    start = time.time()
    try:
        model = capture.load_model(args.target, args.device)
    except capture.ModelError as exc:
        return str(exc)
    n = capture.num_layers(model)
    layer_ids = [*args.target_layer_ids, n]
    problems = id_problems(layer_ids, n)
    if problems:
        return f"layer ids {layer_ids}: {'; '.join(problems)} (the target has {n} layers)"
    rows = datasets.load_from_disk(str(args.data)).with_format(None)["input_ids"]
    count = min(args.limit, len(rows)) if args.limit else len(rows)
    plain_meta = metadata(args.target, layer_ids, args.dtype, args.seed if args.shuffle else None)
    copy_meta = metadata(args.target, layer_ids, args.dtype, args.seed)
    loaded = time.time()
    samples = tokens = 0
    for i in range(worker, count, args.workers):
        ids = [int(t) for t in rows[i]]
        hidden = capture.hidden_states(model, ids, layer_ids, dtype).cpu()
        token_ids = torch.tensor(ids, dtype=torch.int64)
        order = permutation(len(ids), args.seed, i)
        write(args.out, i, hidden[order] if args.shuffle else hidden, token_ids, plain_meta)
        if args.shuffled_copy:
            write(args.shuffled_copy, i, hidden[order], token_ids, copy_meta)
        samples += 1
        tokens += len(ids)
    return {"samples": samples, "tokens": tokens, "load_s": loaded - start, "layer_ids": layer_ids}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", type=Path, help="the target's checkpoint folder")
    parser.add_argument("data", type=Path, help="the dataset `speculators prepare-data` wrote")
    parser.add_argument("out", type=Path, help="folder for hs_<i>.safetensors (made; new)")
    parser.add_argument(
        "--target-layer-ids",
        type=int,
        nargs="+",
        default=list(SPECULATORS_AUX_IDS),
        help="the trainer's ids; the last layer is added",
    )
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--shuffle", action="store_true", help="permute each file's rows")
    parser.add_argument("--shuffled-copy", type=Path, help="also write the shuffled files here")
    parser.add_argument("--seed", type=int, default=0, help="of the row permutations")
    parser.add_argument("--device", default="cuda", help="cuda, or cpu where there is none")
    parser.add_argument("--limit", type=int, default=0, help="only the first N samples")
    parser.add_argument("--report", type=Path, help="write counts and seconds here (JSON)")
    parser.add_argument("--workers", type=int, default=1, help="processes, each a model copy")
    args = parser.parse_args(argv)
    outs = [args.out] + ([args.shuffled_copy] if args.shuffled_copy else [])
    for out in outs:
        if out.exists() and any(out.iterdir()):
            return fail(f"{out} is not empty; pass a new folder")
    if not (args.data / "dataset_info.json").is_file():
        return fail(f"{args.data} is not a saved dataset: pass the folder prepare-data wrote")
    if args.workers < 1:
        return fail(f"--workers {args.workers}: pass 1 or more")
    for out in outs:
        out.mkdir(parents=True, exist_ok=True)

    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        args.device = "cpu"
    start = time.time()
    if args.workers == 1:
        done = [shard(args, 0)]
    else:  # spawn: a forked child cannot use CUDA
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(args.workers, mp_context=ctx) as pool:
            done = list(pool.map(shard, [args] * args.workers, range(args.workers)))
    errors = [d for d in done if isinstance(d, str)]
    if errors:
        return fail(errors[0])
    parts = [d for d in done if not isinstance(d, str)]
    load_s = max(d["load_s"] for d in parts)
    report = {
        "samples": sum(d["samples"] for d in parts),
        "tokens": sum(d["tokens"] for d in parts),
        "layer_ids": parts[0]["layer_ids"],
        "dtype": args.dtype,
        "shuffled": args.shuffle,
        "shuffled_copy": str(args.shuffled_copy) if args.shuffled_copy else None,
        "seed": args.seed,
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "workers": args.workers,
        "seconds": {"load": round(load_s, 1), "states": round(time.time() - start - load_s, 1)},
    }
    if args.report:
        args.report.write_text(json.dumps(report, indent=2))
    print("hf_states:", json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
