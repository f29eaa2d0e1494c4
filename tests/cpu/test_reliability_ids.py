"""Hostile request ids cannot escape or break the hidden-states folder, on every release.

vLLM < 0.22: our connector. vLLM >= 0.22: vLLM's own ExampleHiddenStatesConnector with
`hidden-states-safe-file-names`. Each id goes through vLLM's real scheduler and the
scheduler-side connector it builds, then the worker side writes the file: the path returned
in `kv_transfer_params` is a file directly in the folder, it holds the request's tokens, and
nothing is created anywhere else (`outside` stands for the rest of the filesystem).
"""

from __future__ import annotations

import os

import pytest
import torch
from conftest import needs, our_connector
from safetensors.torch import load_file
from upstream_worker import cpu_copies  # noqa: F401 (a fixture)

from speculators_hybrid.vllm_patches.file_names import ORDINARY, file_stem, hidden_states_path

HOSTILE = {
    "dotdot": "../../x",
    "dotdot-deep": "../../../../../../../../tmp/escaped",
    "absolute": "/etc/cron.d/evil",
    "nul": "a\x00b",
    "long": "x" * 5000,
    "dot": ".",
    "twodots": "..",
    "slashes": "a/b/c",
    "trailing-slash": "dir/",
    "unicode": "r\u00e9qu\u00eate-\u65e5\u672c-\U0001f600",
    "newline": "a\nb",
    "empty": "",
    "backslash": "a\\..\\b",
    "surrogate": "bad-\ud800",
}
ORDINARY_IDS = ["cmpl-9f1c2e3d4b5a69788796a5b4c3d2e1f0-0", "cmpl-abc-0-1a2b3c4d", "req_7", "0"]


def test_ordinary_ids_keep_their_name_and_hostile_ones_are_hashed():
    for req_id in ORDINARY_IDS:
        assert file_stem(req_id) == req_id
    stems = {name: file_stem(req_id) for name, req_id in HOSTILE.items()}
    for name, stem in stems.items():
        assert "+" in stem and not ORDINARY.fullmatch(stem), name  # never an ordinary name
        assert os.sep not in stem and "\x00" not in stem and stem not in (".", ".."), name
        assert len(stem) <= 48 + 1 + 32 and stem.isascii(), name
        assert not stem.startswith(("-", ".")), name
        assert os.path.dirname(hidden_states_path("/data/hs", HOSTILE[name])) == "/data/hs"
    assert len(set(stems.values())) == len(stems)  # distinct ids, distinct files
    assert file_stem("a/b") != file_stem("a_b") and file_stem("a_b") == "a_b"
    assert file_stem("../../x") == file_stem("../../x")  # stable: the same id, the same file
    assert file_stem("../../x").startswith("_.._x+")  # the id stays recognisable


def _outside_is_untouched(root, storage) -> None:
    """Only the storage folder under `root`, and only plain files directly in it."""
    assert sorted(os.listdir(root)) == ["outside", "store"]
    made = sorted(str(p.relative_to(root)) for p in (root / "outside").rglob("*"))
    assert made == ["outside/a", "outside/a/b", "outside/a/b/c"]  # the fixture's, nothing else
    for name in os.listdir(storage):
        assert os.path.isfile(storage / name), name


@pytest.fixture
def folders(tmp_path, monkeypatch):
    """`store` (the storage folder) and `outside`; the process runs inside `outside/a/b/c`, so
    a relative escape from the folder lands in `outside` too."""
    (tmp_path / "store").mkdir()
    deep = tmp_path / "outside" / "a" / "b" / "c"
    deep.mkdir(parents=True)
    monkeypatch.chdir(deep)
    return tmp_path, tmp_path / "store"


def _check_written(path: str, storage, prompt: list[int]) -> None:
    assert os.path.dirname(path) == str(storage)
    assert os.path.basename(path).endswith(".safetensors")
    assert load_file(path)["token_ids"].tolist() == prompt


# ---- our connector (vLLM < 0.22; 0.22-0.23 with chunked prefill) ----


@pytest.mark.shim_only  # our connector class; a patched vLLM source has its own
@our_connector()
def test_our_connector_keeps_hostile_ids_inside_the_folder(shim, folders):
    from reliability_rig import rig

    root, storage = folders
    # In the step, so a failing write would surface in the step (and here) at once.
    made = rig(str(storage), async_writes=False)
    paths = {}
    for i, (name, req_id) in enumerate({**HOSTILE, "ordinary": ORDINARY_IDS[0]}.items()):
        prompt = list(range(1 + i, 30 + i))
        params = made.run(req_id, prompt)
        assert "hidden_states_error" not in params, (name, params)
        paths[name] = params["hidden_states_path"]
        _check_written(paths[name], storage, prompt)
    assert paths["ordinary"] == str(storage / f"{ORDINARY_IDS[0]}.safetensors")
    assert len(set(paths.values())) == len(paths)
    _outside_is_untouched(root, storage)
    locks = [n for n in os.listdir(storage) if n.endswith(".lock")]
    assert len(locks) == len(paths)  # one lock each, next to its file


@pytest.mark.shim_only
@our_connector()
def test_our_connector_off_the_step_too(shim, folders):
    from reliability_rig import rig

    root, storage = folders
    made = rig(str(storage))  # the default: writer threads
    assert made.worker._writer is not None
    for i, req_id in enumerate(HOSTILE.values()):
        params = made.run(req_id, list(range(1, 20 + i)))
        made.drain()
        _check_written(params["hidden_states_path"], storage, list(range(1, 20 + i)))
    made.worker.shutdown()
    _outside_is_untouched(root, storage)


# ---- vLLM >= 0.22: vLLM's own connector with hidden-states-safe-file-names ----


def _upstream(storage):
    from conftest import engine_config

    from speculators_hybrid import planning

    config = engine_config(preset="tiny", ids=(2, 5, 8), prefix_caching=False, max_model_len=4096)
    config.kv_transfer_config.kv_connector_extra_config["shared_storage_path"] = str(storage)
    return config, planning.plan(config, planning.layer_specs(config), 64 << 20)


@needs("hidden-states-safe-file-names")
@pytest.mark.usefixtures("cpu_copies")
def test_vllms_connector_keeps_hostile_ids_inside_the_folder(shim, folders):
    from upstream_worker import extract, extraction, load

    root, storage = folders
    config, kv = _upstream(storage)
    paths = {}
    with extraction(config, kv) as ex:
        assert type(ex.scheduler.connector).__name__ == "ExampleHiddenStatesConnector"
        for i, (name, req_id) in enumerate({**HOSTILE, "ordinary": ORDINARY_IDS[1]}.items()):
            states = torch.randn(20 + i, 3, 256)
            params = extract(ex, req_id, states)
            paths[name] = params["hidden_states_path"]
            data = load(paths[name])  # vLLM's reader: waits on the lock, then reads
            assert torch.equal(data["hidden_states"], states.to(ex.view.dtype)), name
            _check_written(paths[name], storage, list(range(1, 21 + i)))
    assert paths["ordinary"] == str(storage / f"{ORDINARY_IDS[1]}.safetensors")
    assert paths["dotdot"] == hidden_states_path(str(storage), "../../x")
    assert len(set(paths.values())) == len(paths)
    _outside_is_untouched(root, storage)


@needs("hidden-states-safe-file-names")
@pytest.mark.usefixtures("cpu_copies")
def test_without_the_patch_an_id_escapes_or_breaks_the_engine(shim, folders):
    """The stock behaviour this patch removes: vLLM's connector writes where the id says, and
    an id the filesystem refuses raises out of the worker's step."""
    from upstream_worker import extract, extraction, load, without

    root, storage = folders
    config, kv = _upstream(storage)
    with without("hidden-states-safe-file-names"), extraction(config, kv) as ex:
        params = extract(ex, "../outside/escaped", torch.randn(20, 3, 256))
        load(params["hidden_states_path"])
        assert (root / "outside" / "escaped.safetensors").is_file()
        with pytest.raises((ValueError, OSError)):  # embedded NUL / name too long
            extract(ex, "a\x00b", torch.randn(20, 3, 256))
