"""hidden-states-provenance (vLLM >= 0.22): files vLLM's own connector writes carry our
provenance metadata, and the opt-in guard refuses NaN or all-zero rows as our connector does."""

from __future__ import annotations

import fcntl
import json

import pytest
import torch
from conftest import PATCHER, engine_config, needs
from safetensors import safe_open
from upstream_worker import (  # noqa: F401 (cpu_copies: a fixture)
    cpu_copies,
    extract,
    extraction,
    load,
    storage,
    without,
)

import speculators_hybrid
from speculators_hybrid import check, planning
from speculators_hybrid.versions import installed
from speculators_hybrid.vllm_patches import provenance as provenance_patch

pytestmark = [needs("hidden-states-provenance"), pytest.mark.usefixtures("cpu_copies")]

IDS = (2, 5, 8)


def setup(tmp_path, **extra):
    config = engine_config(preset="tiny", ids=IDS, prefix_caching=False, max_model_len=4096)
    storage(config, tmp_path, **extra)
    return config, planning.plan(config, planning.layer_specs(config), 64 << 20)


def states(tokens: int = 40) -> torch.Tensor:
    return torch.randn(tokens, len(IDS), 256)


def metadata(path: str) -> dict[str, str]:
    with safe_open(path, "pt") as f:
        return dict(f.metadata() or {})


def test_file_carries_provenance_and_reads_as_before(shim, tmp_path):
    config, kv = setup(tmp_path)
    written = states()
    with extraction(config, kv) as ex:
        path = extract(ex, "req-1", written)["hidden_states_path"]
        data = load(path)  # vLLM's reader: ignores metadata
        written = written.to(ex.view.dtype)
    assert set(data) == {"hidden_states", "token_ids"}
    assert torch.equal(data["hidden_states"], written)
    assert data["token_ids"].tolist() == list(range(1, len(written) + 1))
    meta = metadata(path)
    assert meta["writer"] == "speculators-hybrid"
    assert meta["speculators_hybrid_version"] == speculators_hybrid.__version__
    assert meta["vllm_version"] == installed("vllm")
    patches = json.loads(meta["speculators_hybrid_patches"])
    assert patches == [p.id for p in PATCHER.selected] and "hidden-states-provenance" in patches
    assert json.loads(meta["layer_ids"]) == list(IDS)
    assert meta["model"] == config.model_config.model and len(meta["model_config_sha256"]) == 64
    # Written aside and renamed; the lock is left, released, for the reader to remove.
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "req-1.safetensors",
        "req-1.safetensors.lock",
    ]
    with open(f"{path}.lock") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    report = check.check_file(path)
    assert report.ok and not report.warnings, report


def test_provenance_is_made_once_per_connector(shim, tmp_path, monkeypatch):
    made = []

    def counted(vllm_config):
        made.append(vllm_config)
        return real(vllm_config)

    real = provenance_patch.provenance
    monkeypatch.setattr(provenance_patch, "provenance", counted)
    config, kv = setup(tmp_path)
    with extraction(config, kv) as ex:
        paths = [extract(ex, f"req-{i}", states())["hidden_states_path"] for i in range(3)]
        for path in paths:
            load(path)
    assert len(made) == 1  # not once per file: it hashes the whole model config
    assert metadata(paths[0]) == metadata(paths[2]) and metadata(paths[0])["layer_ids"]


@pytest.mark.parametrize("opt_in", ["extra_config", "env"])
def test_guard_refuses_all_zero_or_nan_rows(shim, tmp_path, monkeypatch, opt_in):
    if opt_in == "env":
        monkeypatch.setenv("SPECULATORS_HYBRID_REFUSE_BAD", "1")
        config, kv = setup(tmp_path)
    else:
        config, kv = setup(tmp_path, refuse_bad_hidden_states=True)
    zero, nan, good = states(), states(), states()
    zero[17] = 0  # what vLLM 0.24.x was reported to write
    nan[3, 1, 5] = float("nan")
    with extraction(config, kv) as ex:
        paths = {
            name: extract(ex, name, s)["hidden_states_path"]
            for name, s in [("zero", zero), ("nan", nan), ("good", good)]
        }
        for name in ("zero", "nan"):
            with pytest.raises(FileNotFoundError):  # the reader fails: no file to train on
                load(paths[name])
        assert torch.equal(load(paths["good"])["hidden_states"], good.to(ex.view.dtype))
    # The same reasons, in the same marker, as our connector for vLLM < 0.22 leaves.
    assert (tmp_path / "zero.safetensors.rejected").read_text() == (
        "all-zero hidden states at token rows 17"
    )
    assert (tmp_path / "nan.safetensors.rejected").read_text() == "NaN or Inf at token rows 3"
    assert not (tmp_path / "zero.safetensors").exists()
    assert not (tmp_path / "good.safetensors.rejected").exists()


def test_guard_is_off_unless_asked(shim, tmp_path, monkeypatch):
    monkeypatch.delenv("SPECULATORS_HYBRID_REFUSE_BAD", raising=False)
    config, kv = setup(tmp_path)
    zero = states()
    zero[2] = 0
    with extraction(config, kv) as ex:
        path = extract(ex, "zero", zero)["hidden_states_path"]
        assert not load(path)["hidden_states"][2].any()
    assert "zero_rows" in {e["code"] for e in check.check_file(path).errors}


def extract_without(tmp_path, patch_id: str) -> str:
    """The path of a file written with every patch this vLLM needs but `patch_id`."""
    config, kv = setup(tmp_path)
    with without(patch_id), extraction(config, kv) as ex:
        path = extract(ex, "r", states())["hidden_states_path"]
        load(path)  # waits for the writer
    return path


def test_without_the_patch_files_have_no_metadata_and_check_warns(shim, tmp_path):
    path = extract_without(tmp_path, "hidden-states-provenance")
    assert not {k for k in metadata(path) if k != "format"}
    report = check.check_file(path)
    assert report.ok and [w["code"] for w in report.warnings] == ["no_provenance"]


@needs("hidden-states-read-slots")
def test_check_flags_024_files_without_the_read_fix(shim, tmp_path):
    path = extract_without(tmp_path, "hidden-states-read-slots")
    assert "hidden-states-read-slots" not in json.loads(
        metadata(path)["speculators_hybrid_patches"]
    )
    codes = {e["code"] for e in check.check_file(path).errors}
    assert codes == {"bad_provenance", "zero_rows"}
