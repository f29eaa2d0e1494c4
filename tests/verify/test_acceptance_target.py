"""benchmarks/acceptance/target.py on a few stdlib files, on the CPU: the checkpoint it writes is
one vLLM, speculators and transformers read as a Qwen3.5 hybrid with a chat template.

In the `verify` env because that env has torch and transformers without vLLM; two training
steps only (the GPU makes the real target).
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]


def load_target_module():
    spec = importlib.util.spec_from_file_location(
        "acceptance_target", ROOT / "benchmarks/acceptance/target.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_held_out_files_are_not_trained_on() -> None:
    target = load_target_module()
    train, test = target.source_files()
    assert test and train and not set(train) & set(test)
    # about one file in ten, by a hash of the path: the same split on every run
    assert 0.05 < len(test) / (len(train) + len(test)) < 0.15
    assert target.source_files() == (train, test)


def test_chats_are_consecutive_blocks_of_a_file(tmp_path: Path) -> None:
    target = load_target_module()
    lines = [f"line_{i} = {i}" for i in range(70)]
    source = tmp_path / "module.py"
    source.write_text("\n".join(lines))
    chats = target.chats([source])
    assert len(chats) == 70 // (target.USER_LINES + target.REPLY_LINES)
    user, reply = chats[1][0]["content"].split("\n"), chats[1][1]["content"].split("\n")
    step = target.USER_LINES + target.REPLY_LINES
    assert user == lines[step : step + target.USER_LINES]
    assert reply == lines[step + target.USER_LINES : 2 * step]


def test_a_small_target_is_a_complete_qwen3_5_checkpoint(tmp_path: Path) -> None:
    from transformers import AutoConfig, AutoTokenizer

    target = load_target_module()
    out = tmp_path / "target"
    code = target.main(
        [str(out), "--device", "cpu", "--limit-files", "30", "--max-steps", "2", "--batch", "2"]
        + ["--eval-chats", "4"]
    )
    assert code == 0
    report = json.loads((out / "target.json").read_text())
    assert report["steps"] == 2 and math.isfinite(report["heldout_loss"])
    assert report["files"] == {"train": 30, "held_out": 3}

    config = AutoConfig.from_pretrained(out)
    text = config.text_config
    assert config.model_type == "qwen3_5" and text.num_hidden_layers == 8
    assert text.layer_types.count("full_attention") == 2
    tok = AutoTokenizer.from_pretrained(out)
    assert len(tok) == text.vocab_size == 4096
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [0, 1, 2]
    vision = tok.convert_tokens_to_ids(list(target.VISION))
    assert vision == [config.image_token_id, config.video_token_id] + [
        config.vision_start_token_id,
        config.vision_end_token_id,
    ]
    assert text.eos_token_id == tok.eos_token_id == 2
    chat = [{"role": "user", "content": "import os"}]
    prompt = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    assert prompt == "<|im_start|>user\nimport os<|im_end|>\n<|im_start|>assistant\n"
    ids = tok(prompt, add_special_tokens=False)["input_ids"]
    assert ids[0] == 1 and tok.decode(ids) == prompt
    held = [json.loads(line) for line in (out / "heldout.jsonl").open()]
    assert held and held[0]["conversations"][1]["role"] == "assistant"
    for name in ("preprocessor_config.json", "video_preprocessor_config.json", "model.safetensors"):
        assert (out / name).exists()


def test_an_existing_folder_is_refused(tmp_path: Path, capsys) -> None:
    target = load_target_module()
    assert target.main([str(tmp_path)]) == 2
    assert "exists" in capsys.readouterr().err
