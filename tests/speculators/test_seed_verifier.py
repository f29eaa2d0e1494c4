"""benchmarks/seed_job/verifier.py on the CPU, against speculators 0.9.0's own trainer path.

The seed job's verifier folder holds only what the trainer reads of Qwen3.6-27B. speculators'
own config resolution and `build_draft_model` (what `speculators train --speculator-type dflash`
runs) must take the embeddings, lm_head and final norm from it, value for value; at the real
size the names and shapes are the preset's, and the draft built from the real config has the
parameter count the seed job's memory budget (benchmarks/seed_job/README.md) is computed from.
The chats must render to exactly the lengths drawn, uniform over [lo, hi].
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest
import torch
from conftest import VERSION
from packaging.version import Version
from safetensors.torch import load_file

if VERSION < Version("0.9.0"):
    pytest.skip("the seed job runs speculators 0.9.0", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.seed_job import verifier  # noqa: E402
from speculators_hybrid.models import write_config  # noqa: E402

EMBED, NORM = "model.language_model.embed_tokens.weight", "model.language_model.norm.weight"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("seed") / "verifier"
    verifier.write_verifier(folder, "tiny", files=20)
    return folder


def draft(folder: Path, data: Path, *extra: str):
    from speculators.model import SpeculatorModel
    from speculators.train.cli import build_draft_model, parse_vocab_mappings
    from speculators.train.config.schema import TrainConfig

    argv = ["--speculator-type", "dflash", "--verifier-name-or-path", str(folder),
            "--data-path", str(data), "--target-layer-ids", "2", "4", "5", *extra]  # fmt: skip
    args = argparse.Namespace(**TrainConfig.resolve(argv).flatten())
    d2t, t2d, vocab = parse_vocab_mappings(args)
    return build_draft_model(args, SpeculatorModel.registry["dflash"], t2d, d2t, vocab)


def test_the_trainer_reads_embeddings_lm_head_and_norm(tiny: Path, tmp_path: Path) -> None:
    index = json.loads((tiny / verifier.INDEX).read_text())
    assert set(index["weight_map"]) == set(verifier.verifier_tensors("tiny"))
    saved = load_file(tiny / verifier.SHARD)
    # an explicit mask id: the lookup otherwise loads AutoProcessor (torchvision, not in this env)
    model = draft(tiny, tmp_path, "--num-layers", "1", "--mask-token-id", "0")
    assert model.embed_tokens.weight.shape == (1024, 256)
    assert torch.equal(model.embed_tokens.weight.to(torch.bfloat16), saved[EMBED])
    assert torch.equal(model.verifier_lm_head.weight.to(torch.bfloat16), saved["lm_head.weight"])
    assert torch.equal(model.verifier_norm.weight.to(torch.bfloat16), saved[NORM])


def test_real_size_names_shapes_and_draft_parameters(tmp_path: Path) -> None:
    from speculators.models.dflash.model_definitions import Qwen3DFlashDecoderLayer
    from speculators.train.cli import create_transformer_layer_config

    assert verifier.verifier_tensors("qwen3.6-27b") == {
        EMBED: (248320, 5120),
        "lm_head.weight": (248320, 5120),
        NORM: (5120,),
    }
    folder = write_config(tmp_path / "real", "qwen3.6-27b")
    layer_config = create_transformer_layer_config(
        verifier_name_or_path=str(folder),
        num_layers=5,  # speculators 0.9.0's default for dflash
        draft_arch="qwen3",
        hidden_act=None,
        sliding_window=2048,
        full_attention_indices=[],
    )
    with torch.device("meta"):
        layer = Qwen3DFlashDecoderLayer(layer_config, 0)
    per_layer = sum(p.numel() for p in layer.parameters())
    # README's budget: 5 DFlash layers of 330.3 M parameters at the verifier's width (20 heads
    # of 256: speculators makes hidden / head_dim heads where 24 do not divide 5,120)
    assert (layer_config.hidden_size, layer_config.intermediate_size) == (5120, 17408)
    assert (layer_config.num_attention_heads, layer_config.num_key_value_heads) == (20, 4)
    assert per_layer == 330_312_192


def test_chats_render_to_the_drawn_lengths(tiny: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny)
    stream = verifier.token_stream(tokenizer, verifier.stdlib_files(40), chars=400_000)
    chats, lengths = verifier.make_chats(tokenizer, stream, 120, lo=100, hi=200, seed=1)
    assert [verifier.rendered_length(tokenizer, c) for c in chats[:20]] == lengths[:20]
    assert all(100 <= n <= 200 for n in lengths)
    assert 135 < sum(lengths) / len(lengths) < 165  # uniform over [100, 200]: mean 150
    assert len(set(lengths)) > 50
    assert all(c[0]["role"] == "user" and c[1]["role"] == "assistant" for c in chats)
    # the seed job's own lengths
    _, real = verifier.make_chats(tokenizer, stream, 4, seed=2)
    assert all(1000 <= n <= 2000 for n in real), real
    stats = verifier.length_stats(real, 1000, 2000)
    assert stats["exact"] == 4 and stats["tokens"] == sum(real)
