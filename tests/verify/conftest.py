"""Tiny random Qwen3.5 hybrids (speculators_hybrid.models' 'tiny' preset: 8 layers, hidden 256)
and hidden-state files written the way a server would, but not by verify's code: the writer is
a separate bf16 model with eager attention (verify's reference uses sdpa), fed in chunks with
its cache like a chunked prefill, reading transformers' `output_hidden_states` for ids < n and
the final norm's input for id n."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from speculators_hybrid.models import hf_config, save_random_model

try:
    import torch
    import transformers
except ImportError:  # an env without the verify extra: nothing here to run (tox env verify)
    collect_ignore_glob = ["test_*.py"]

IDS = [1, 4, 5, 8]  # n = 8: the last is the final pre-norm state
VOCAB = 1020  # plain tokens 1..1019 (0 is EOS, the last four ids are vision specials)
CHUNK = 48


def tokens(seed: int, n: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, VOCAB, (n,), generator=g).tolist()


def build(folder: Path, multimodal: bool) -> Path:
    cls = (
        transformers.Qwen3_5ForConditionalGeneration
        if multimodal
        else transformers.Qwen3_5ForCausalLM
    )
    return save_random_model(folder, cls, hf_config("tiny", multimodal), seed=1)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("tiny") / "model", multimodal=False)


@pytest.fixture(scope="session")
def multimodal_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("tiny_mm") / "model", multimodal=True)


class Writer:
    """A server stand-in: bf16, eager attention, chunked prefill through its own cache."""

    def __init__(self, folder: Path) -> None:
        config = json.loads((folder / "config.json").read_text())
        cls = getattr(transformers, config["architectures"][0])
        self.model = cls.from_pretrained(
            folder, dtype=torch.bfloat16, attn_implementation="eager"
        ).eval()
        inner = self.model.model
        self.text = getattr(inner, "language_model", inner)
        self.done: dict[tuple, torch.Tensor] = {}

    def states(self, prompt: list[int], ids: list[int], post_norm: bool = False) -> torch.Tensor:
        """[tokens, len(ids), hidden] bf16; `post_norm`: id n after the final norm (the bug)."""
        key = (tuple(prompt), tuple(ids), post_norm)
        if key not in self.done:
            self.done[key] = self._states(prompt, ids, post_norm)
        return self.done[key]

    def _states(self, prompt: list[int], ids: list[int], post_norm: bool) -> torch.Tensor:
        n = len(self.text.layers)
        rows, cache = [], None
        for start in range(0, len(prompt), CHUNK):
            before: list[torch.Tensor] = []
            hook = self.text.norm.register_forward_pre_hook(lambda m, a, b=before: b.append(a[0]))
            try:
                with torch.no_grad():
                    out = self.model(
                        input_ids=torch.tensor([prompt[start : start + CHUNK]]),
                        cache=cache,
                        use_cache=True,
                        output_hidden_states=True,
                    )
            finally:
                hook.remove()
            cache = out.past_key_values
            hs = out.hidden_states  # n + 1 entries, the last one after the final norm
            assert len(hs) == n + 1
            pick = [hs[i] if i < n or post_norm else before[0] for i in ids]
            rows.append(torch.stack([p[0] for p in pick], dim=1))
        return torch.cat(rows)


@pytest.fixture(scope="session")
def writer(model_dir: Path) -> Writer:
    return Writer(model_dir)


def write(
    path: Path,
    prompt: list[int],
    states: torch.Tensor,
    ids: list[int] | None = IDS,
    **metadata: str,
) -> Path:
    """A file as our connector writes it (provenance with `layer_ids` unless `ids` is None)."""
    meta = {"writer": "tests/verify", **metadata}
    if ids is not None:
        meta["layer_ids"] = json.dumps(ids)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {"hidden_states": states.contiguous(), "token_ids": torch.tensor(prompt)}
    from safetensors.torch import save_file

    save_file(tensors, str(path), metadata=meta)
    return path


def cli(*argv: str | Path) -> tuple[int, str, str]:
    """`speculators-hybrid ARGV...` in this process: (exit status, stdout, stderr)."""
    import contextlib
    import io

    from speculators_hybrid.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def verify_json(*argv: str | Path) -> tuple[int, dict, str]:
    code, out, err = cli("verify", *argv, "--json", "--device", "cpu")
    return code, (json.loads(out) if out.strip() else {}), err


@pytest.fixture(scope="session")
def reference(model_dir: Path) -> torch.nn.Module:
    """verify's own model, loaded once for the tests that call the Verifier directly."""
    from speculators_hybrid.verify import capture

    return capture.load_model(model_dir)
