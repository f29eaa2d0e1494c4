"""Files in our format are read by each speculators release's own loaders and validator.

The dataset is saved the way speculators' preprocessing saves it (`input_ids`, `loss_mask`,
`seq_len`, torch format); the files are written by our connector's `write_file` into
`<dataset>/hidden_states/hs_<i>.safetensors`, where speculators' trainer looks for them.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from conftest import VERSION
from packaging.version import Version
from safetensors.torch import load_file, save_file

from speculators_hybrid import check

ROWS = [[11, 12, 13, 14, 15], [7, 8, 9], [21, 22, 23, 24, 25, 26, 27, 28]]
IDS, HIDDEN = 4, 32
PROVENANCE = {
    "speculators_hybrid_version": "0.1.0",
    "vllm_version": "0.20.1",
    "speculators_hybrid_patches": "keep-hma-for-extraction,hidden-states-own-group",
    "layer_ids": "[2, 32, 61, 64]",
}
needs_070 = pytest.mark.skipif(VERSION < Version("0.7.0"), reason="added in speculators 0.7.0")


def hidden(i: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(i)
    return torch.randn(len(ROWS[i]), IDS, HIDDEN, generator=gen).to(torch.bfloat16)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    import datasets

    from speculators_hybrid.vllm_patches.connector import write_file

    root = tmp_path_factory.mktemp("prepared") / "data"
    ds = datasets.Dataset.from_dict(
        {
            "input_ids": ROWS,
            "loss_mask": [[0, 0] + [1] * (len(r) - 2) for r in ROWS],
            "seq_len": [len(r) for r in ROWS],
        }
    )
    ds.set_format(type="torch")
    ds.save_to_disk(str(root))
    (root / "hidden_states").mkdir()
    for i, row in enumerate(ROWS[:2]):
        tensors = {"hidden_states": hidden(i), "token_ids": torch.tensor(row, dtype=torch.int64)}
        write_file(str(root / "hidden_states" / f"hs_{i}.safetensors"), tensors)
    # The third as the connector will write it with provenance metadata.
    tensors = {"hidden_states": hidden(2), "token_ids": torch.tensor(ROWS[2], dtype=torch.int64)}
    save_file(tensors, str(root / "hidden_states" / "hs_2.safetensors"), metadata=PROVENANCE)
    return root


def files(root: Path) -> list[Path]:
    return [root / "hidden_states" / f"hs_{i}.safetensors" for i in range(len(ROWS))]


def test_connector_releases_every_lock(data):
    """The lock file stays, as vLLM's writer leaves it, released: readers take it and remove it."""
    import fcntl

    locks = list((data / "hidden_states").glob("*.lock"))
    assert len(locks) == 2  # hs_0, hs_1 come from write_file; hs_2 is written directly
    for path in locks:
        with open(path) as lock:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)


def sample(root: Path, index: int):
    """Sample `index` through speculators' `ArrowDataset`, split the way its trainer splits."""
    from speculators.train.data import ArrowDataset

    common = dict(max_len=64, datapath=str(root), on_missing="raise")
    if VERSION >= Version("0.7.0"):
        return ArrowDataset(**common)[index]
    # 0.5.x / 0.6.x: train on the first 90 % (split_ratio=0.9), validate on the rest (-0.1).
    train = ArrowDataset(**common, split_ratio=0.9)
    if index < len(train):
        return train[index]
    return ArrowDataset(**common, split_ratio=-0.1)[index - len(train)]


def test_speculators_dataset_loader_reads_them(data):
    for i, row in enumerate(ROWS):
        item = sample(data, i)
        assert isinstance(item, dict), item
        assert item["input_ids"].tolist() == row
        hs = hidden(i).to(item["hidden_states"].dtype)
        assert torch.equal(item["hidden_states"], hs[:, :-1].flatten(1))  # [tokens, 3 * hidden]
        assert torch.equal(item["verifier_last_hidden_states"], hs[:, -1])


@needs_070
def test_speculators_validator_accepts_them(data):
    from speculators.data_generation.offline import check_hidden_states

    for i, path in enumerate(files(data)):
        check_hidden_states(load_file(path), ROWS[i])


def _file_transfer():
    try:
        from hs_connectors import FileTransfer
    except ImportError:  # 0.7.x vendors it
        from speculators._vendor.hs_connectors import FileTransfer
    return FileTransfer


@needs_070
def test_speculators_file_transfer_reads_them(data):
    transfer = _file_transfer()(data / "hidden_states")
    for i, path in enumerate(files(data)):
        cached = transfer.get_cached(i)
        assert torch.equal(cached["hidden_states"], hidden(i))
        params = {"hidden_states_path": str(path)} if VERSION >= Version("0.9.0") else str(path)
        generated = transfer.get_generated(params)
        assert torch.equal(generated["token_ids"], torch.tensor(ROWS[i]))


def test_check_passes_them_against_the_dataset(data, capsys):
    assert check.main([str(data / "hidden_states"), "--dataset", str(data)]) == 0
    assert "3 of 3 samples have a file" in capsys.readouterr().out


def test_zero_hidden_states_pass_speculators_but_not_check(data, tmp_path, capsys):
    """The issue-613 symptom: speculators trains on all-zero hidden states without a word."""
    root = tmp_path / "data"
    shutil.copytree(data, root)
    path = root / "hidden_states" / "hs_1.safetensors"
    zeros = torch.zeros(len(ROWS[1]), IDS, HIDDEN, dtype=torch.bfloat16)
    save_file({"hidden_states": zeros, "token_ids": torch.tensor(ROWS[1])}, str(path))
    assert isinstance(sample(root, 1), dict)  # accepted by the loader
    if VERSION >= Version("0.7.0"):
        from speculators.data_generation.offline import check_hidden_states

        check_hidden_states(load_file(path), ROWS[1])  # and by the validator
    assert check.main([str(root / "hidden_states"), "--dataset", str(root)]) == 1
    assert f"FAILED {path}: every hidden state is zero" in capsys.readouterr().out
