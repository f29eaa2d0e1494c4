"""Give the stdlib-tiny target a native MTP head, laid out as a real Qwen3.5 checkpoint's.

A published Qwen3.5/3.6 checkpoint carries one multi-token-prediction layer: `mtp_num_hidden_layers:
1` in its text config and `mtp.*` weights (`mtp.fc`, `mtp.pre_fc_norm_hidden`,
`mtp.pre_fc_norm_embedding`, `mtp.layers.0.*` a full-attention decoder layer, `mtp.norm`), which
vLLM serves with `--speculative-config '{"method": "mtp"}'` and speculators finetunes with
`--speculator-type mtp`. The target that target.py trains has none (transformers' model has no
such module), so this adds one in place: random weights at the model's own initializer range,
the norms' zero-centred gains at zero, as an untrained head starts. Finetuning it is then training
a one-layer drafter from scratch, which is what the loop measures. The target's own layers and
outputs do not change: vLLM and transformers leave `mtp.*` out of the model they build.

    python benchmarks/acceptance/mtp_head.py TARGET
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

WEIGHTS = "model.safetensors"


def head_weights(text: dict, seed: int = 0) -> dict:
    """The head's tensors by checkpoint name, in bfloat16."""
    import torch
    from transformers import Qwen3_5TextConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer

    config = Qwen3_5TextConfig(**text)
    full = [i for i, kind in enumerate(config.layer_types) if kind == "full_attention"][-1]
    torch.manual_seed(seed)
    layer = Qwen3_5DecoderLayer(config, layer_idx=full)
    hidden, std = config.hidden_size, config.initializer_range
    weights = {f"mtp.layers.0.{k}": v for k, v in layer.state_dict().items()}
    weights["mtp.fc.weight"] = torch.empty(hidden, 2 * hidden)
    for name in ("norm", "pre_fc_norm_hidden", "pre_fc_norm_embedding"):
        weights[f"mtp.{name}.weight"] = torch.empty(hidden)
    for name, value in weights.items():
        if "norm" in name.split(".")[-2]:  # the norms, pre_fc_norm_hidden among them
            value.zero_()  # Qwen3.5's RMSNorm scales by 1 + w
        else:
            value.normal_(0.0, std)
    return {k: v.to(torch.bfloat16).contiguous() for k, v in weights.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", type=Path, help="target.py's checkpoint (changed in place)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    config_path, weights_path = args.target / "config.json", args.target / WEIGHTS
    if not config_path.is_file() or not weights_path.is_file():
        print(f"mtp_head: {args.target} has no config.json and {WEIGHTS}", file=sys.stderr)
        return 2
    config = json.loads(config_path.read_text())
    text = config.get("text_config", config)
    if text.get("mtp_num_hidden_layers"):
        print(f"mtp_head: {args.target} already has an MTP head")
        return 0

    from safetensors.torch import load_file, save_file

    tensors = load_file(str(weights_path))
    head = head_weights(text, args.seed)
    save_file({**tensors, **head}, str(weights_path), metadata={"format": "pt"})
    text["mtp_num_hidden_layers"] = 1
    text["mtp_use_dedicated_embeddings"] = False
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    count = sum(v.numel() for v in head.values())
    print(f"mtp_head: {len(head)} tensors, {count:,} parameters added to {args.target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
