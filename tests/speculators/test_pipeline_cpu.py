"""speculators' own data path on files our connector wrote, end to end on the CPU (issue 15).

The files come from our real connector worker (vLLM 0.20.1's `VllmConfig` for the tiny
Qwen3.5 hybrid, the launcher's layer ids, a CPU cache view, vLLM's request ids and
`{shared_storage_path}/{req_id}.safetensors` paths, writes off the engine step as by default;
in the step for speculators 0.5.0, which does not wait on the lock, as `launch` picks). Then
speculators' own code takes over, as far as the installed release has it:

- its lock wait and load (`hs_connectors` / vendored `FileTransfer.get_generated`, the offline
  generator's `wait_for_lock`) and its validator (`check_hidden_states`), 0.7+;
- the offline generator's placement (`shutil.move` to `<data>/hidden_states/hs_<i>.safetensors`);
- its `ArrowDataset` over prepared data (`input_ids`, `loss_mask`, `seq_len`) with
  `--on-missing raise` (every file must be there), its collate function and EAGLE-3 shift;
- the drafters' own forward and loss (EAGLE-3 and DFlash built by `from_training_args` against
  a verifier holding the tiny model's embeddings, final norm and lm_head), trained with AdamW
  on 16 fixed samples: the loss must be finite and fall.

Where the CPU stops: speculators' `Trainer` moves the model to `local_rank` (an accelerator
index) and autocasts on the accelerator's device type, so the trainer loop itself needs a GPU
(tests/gpu/test_speculators_pipeline.py); the loop here calls the same forward with the same
batches, under the speculators-side patches `run` applies (the verifier norm).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm")

import torch  # noqa: E402
from conftest import ALGORITHMS, VERSION  # noqa: E402
from packaging.version import Version  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from speculators_hybrid import cpu  # noqa: E402

cpu.prepare()

from vllm.plugins import load_general_plugins  # noqa: E402

load_general_plugins()

from speculators_hybrid import check, planning  # noqa: E402
from speculators_hybrid.launcher import builtin  # noqa: E402
from speculators_hybrid.models import PRESETS, write_config  # noqa: E402
from speculators_hybrid.plugin import PATCHER as VLLM_PATCHER  # noqa: E402
from speculators_hybrid.plugin import vllm_patches  # noqa: E402

N_LAYERS = PRESETS["tiny"]["layers"]
HIDDEN = PRESETS["tiny"]["hidden_size"]
VOCAB = PRESETS["tiny"]["vocab_size"]
SAMPLES, BLOCK, MAX_LEN = 16, 16, 160  # 4 samples of <= 40 tokens fill a batch
WAITS = VERSION >= Version("0.6.0")  # readers that wait on `<path>.lock`


def launcher_ids() -> list[int]:
    """The ids `speculators-hybrid launch` passes without --target-layer-ids (speculators' own
    default, [2, n//2, n-3, n])."""
    args = builtin.parser(builtin.backends()).parse_args(["model"])
    ids, _note = builtin.layer_ids(args, N_LAYERS)
    return ids


IDS = launcher_ids()


def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(15)
    lengths = torch.randint(20, 41, (SAMPLES,), generator=gen).tolist()
    return [torch.randint(4, VOCAB - 8, (n,), generator=gen).tolist() for n in lengths]


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    """The tiny Qwen3.5 checkpoint's config plus the verifier weights speculators loads."""
    root = write_config(tmp_path_factory.mktemp("target") / "tiny", "tiny", True)
    gen = torch.Generator().manual_seed(0)
    weights = {
        "model.language_model.embed_tokens.weight": torch.randn(VOCAB, HIDDEN, generator=gen),
        "lm_head.weight": torch.randn(VOCAB, HIDDEN, generator=gen) * 0.05,
        "model.language_model.norm.weight": torch.randn(HIDDEN, generator=gen) * 0.3,
    }
    save_file(weights, str(root / "model.safetensors"))
    return root


@pytest.fixture(scope="module")
def served(target, tmp_path_factory):
    """(storage folder, [(request id, path, prompt, rows)]) written by our connector worker."""
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    from speculators_hybrid.vllm_patches.connector import (
        HiddenStatesMetadata,
        HybridHiddenStatesConnector,
        SaveRequest,
        slots_for,
    )

    VLLM_PATCHER.revert()
    VLLM_PATCHER.apply(vllm_patches())
    storage = tmp_path_factory.mktemp("hidden_states_server")
    setup = planning.Setup(model=str(target), layer_ids=tuple(IDS), max_model_len=4096)
    config = planning.engine_config(setup)
    extra = config.kv_transfer_config.kv_connector_extra_config
    extra["shared_storage_path"] = str(storage)
    if not WAITS:
        extra["async_writes"] = False  # what `launch` picks beside speculators 0.5.0
    name, _layer = planning.hidden_state_layer(config)
    connector = HybridHiddenStatesConnector(config, KVConnectorRole.WORKER)
    assert (connector._writer is not None) == WAITS
    per = -(-40 // BLOCK)
    cache = torch.zeros(SAMPLES * per + 1, BLOCK, len(IDS), HIDDEN, dtype=torch.bfloat16)
    connector.register_kv_caches({name: cache})

    gen = torch.Generator().manual_seed(1)
    emb = torch.randn(VOCAB, HIDDEN, generator=gen)
    saves, written = [], []
    for i, prompt in enumerate(prompts()):
        # Rows that depend on the tokens (so a drafter can learn from them), one per layer id.
        tokens = torch.tensor(prompt)
        rows = torch.stack(
            [emb[tokens] * (k + 1) + emb[tokens.roll(k)] for k in range(len(IDS))], 1
        )
        rows = rows.to(torch.bfloat16)
        blocks = [SAMPLES * per - i * per - b for b in range(per)]  # scattered, descending
        slots = slots_for(blocks, BLOCK, len(prompt))
        cache[slots // BLOCK, slots % BLOCK] = rows
        req_id = f"cmpl-{i:032x}-0"  # vLLM's completions request id form
        path = os.path.join(storage, f"{req_id}.safetensors")
        saves.append(SaveRequest(req_id, path, prompt, slots))
        written.append((req_id, path, prompt, rows))
    connector.bind_connector_metadata(HiddenStatesMetadata(saves))
    connector.save_kv_layer(name, cache, None)  # one engine step finishing all 16 requests
    yield storage, written, (connector, name, cache)
    connector.shutdown()


def _file_transfer():
    try:
        from hs_connectors import FileTransfer
    except ImportError:  # 0.7.x vendors it
        from speculators._vendor.hs_connectors import FileTransfer
    return FileTransfer


def _wait_for_lock():
    """The lock wait of speculators' offline generator (`generate_offline_data`)."""
    try:
        from speculators.data_generation.vllm_client import wait_for_lock
    except ImportError:
        from hs_connectors.transfer import wait_for_lock
    return wait_for_lock


@pytest.fixture(scope="module")
def prepared(served, tmp_path_factory) -> Path:
    """speculators' prepared data (as `prepare-data` saves it) with each sample's file moved
    into `<data>/hidden_states/hs_<i>.safetensors` the way its offline generator does: wait on
    the lock (0.6+), `shutil.move`, then its validator (0.7+)."""
    import datasets

    storage, written, _rig = served
    root = tmp_path_factory.mktemp("prepared") / "data"
    rows = [prompt for _, _, prompt, _ in written]
    ds = datasets.Dataset.from_dict(
        {
            "input_ids": rows,
            "loss_mask": [[0] * 4 + [1] * (len(r) - 4) for r in rows],
            "seq_len": [len(r) for r in rows],
        }
    )
    ds.set_format(type="torch")
    ds.save_to_disk(str(root))
    out = root / "hidden_states"
    out.mkdir()
    for i, (_req, path, prompt, _rows) in enumerate(written):
        lock = f"{path}.lock"
        if WAITS and os.path.exists(lock):
            _wait_for_lock()(lock)
        target = out / f"hs_{i}.safetensors"
        shutil.move(path, target)
        if VERSION >= Version("0.7.0"):
            from speculators.data_generation.offline import check_hidden_states

            check_hidden_states(load_file(target), prompt)
    return root


def test_our_files_are_where_the_response_says_and_whole(served):
    """The path the request's kv_transfer_params name, the layout speculators reads."""
    storage, written, _rig = served
    for req_id, path, prompt, rows in written:
        assert path == os.path.join(storage, f"{req_id}.safetensors")
        with open(f"{path}.lock") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # wait as the reader does, whatever the mode
        data = load_file(path)
        assert set(data) == {"hidden_states", "token_ids"}
        assert data["hidden_states"].shape == (len(prompt), len(IDS), HIDDEN)
        assert torch.equal(data["hidden_states"], rows)
        assert data["token_ids"].dtype == torch.int64 and data["token_ids"].tolist() == prompt


@pytest.mark.skipif(VERSION < Version("0.7.0"), reason="hs_connectors' FileTransfer: 0.7.0+")
def test_speculators_online_reader_takes_our_files(served, tmp_path):
    """`--on-missing generate`'s read: `FileTransfer.get_generated` with the response's
    transfer params (0.9: the dict; earlier: the path), which waits on and removes the lock,
    then `check_hidden_states`, then `delete` (as the trainer does after a good sample)."""
    from speculators.data_generation.offline import check_hidden_states

    _storage, written, _rig = served
    req_id, path, prompt, rows = written[3]
    copy = tmp_path / f"{req_id}.safetensors"  # a copy: the module's files stay for the others
    shutil.copy(path, copy)
    Path(f"{copy}.lock").touch()  # a released lock, as our writer leaves it
    transfer = _file_transfer()(tmp_path)
    params = {"hidden_states_path": str(copy)} if VERSION >= Version("0.9.0") else str(copy)
    loaded = transfer.get_generated(params)
    assert not Path(f"{copy}.lock").exists()  # taken and removed by speculators' wait
    check_hidden_states(loaded, prompt)
    assert torch.equal(loaded["hidden_states"], rows)
    transfer.delete(str(copy))
    assert not copy.exists()


@pytest.mark.skipif(not WAITS, reason="speculators 0.5.0 does not wait on the lock")
def test_speculators_lock_wait_holds_until_our_writer_renames(served, tmp_path, monkeypatch):
    """A write still in flight off the step: speculators' own wait returns only once the file
    is whole under its final name (the lock is ours until the rename)."""
    import threading

    from speculators_hybrid.vllm_patches import writer
    from speculators_hybrid.vllm_patches.connector import (
        HiddenStatesMetadata,
        SaveRequest,
        slots_for,
    )

    _storage, written, (connector, name, cache) = served
    release = threading.Event()
    real = writer.save_whole

    def slow_disk(*args, **kwargs):
        assert release.wait(30)
        real(*args, **kwargs)

    monkeypatch.setattr(writer, "save_whole", slow_disk)
    _req, _path, prompt, rows = written[0]
    cache = cache.clone()  # this step's own view: the module's files are already written
    slots = slots_for([1, 2, 3], BLOCK, len(prompt))
    cache[slots // BLOCK, slots % BLOCK] = rows
    path = str(tmp_path / "cmpl-slow-0.safetensors")
    connector.bind_connector_metadata(HiddenStatesMetadata([SaveRequest("s", path, prompt, slots)]))
    connector.save_kv_layer(name, cache, None)
    done = threading.Event()

    def reader():
        _wait_for_lock()(f"{path}.lock", timeout=30)
        done.set()

    thread = threading.Thread(target=reader)
    thread.start()
    assert not done.wait(0.5) and not os.path.exists(path)
    release.set()
    thread.join(30)
    assert done.is_set() and torch.equal(load_file(path)["hidden_states"], rows)


def dataset(root: Path):
    """Every sample through speculators' ArrowDataset, `--on-missing raise`, whole dataset."""
    from speculators.train.data import ArrowDataset

    common = dict(max_len=MAX_LEN, datapath=str(root), on_missing="raise")
    if VERSION >= Version("0.7.0"):
        return ArrowDataset(**common)
    # 0.5.x / 0.6.x: the trainer's two splits, first 90 % and the rest (their split_ratio=1.0
    # default sets no start_file_idx and cannot read a sample; the trainer never uses it).
    from torch.utils.data import ConcatDataset

    return ConcatDataset([ArrowDataset(**common, split_ratio=r) for r in (0.9, -0.1)])


def test_speculators_dataset_reads_every_sample(prepared, served):
    _storage, written, _rig = served
    ds = dataset(prepared)
    assert len(ds) == SAMPLES
    for i, (_req, _path, prompt, rows) in enumerate(written):
        item = ds[i]
        assert isinstance(item, dict), item
        assert item["input_ids"].tolist() == prompt
        assert torch.equal(item["hidden_states"], rows[:, :-1].flatten(1))
        assert torch.equal(item["verifier_last_hidden_states"], rows[:, -1])
    assert check.main([str(prepared / "hidden_states"), "--dataset", str(prepared)]) == 0


def collate(algorithm: str):
    from speculators.models.eagle3.data import shift_batch

    preprocess = shift_batch if algorithm == "eagle3" else None
    if VERSION >= Version("0.7.0"):
        from speculators.train.data import CollateFn

        return CollateFn(MAX_LEN, HIDDEN, len(IDS) - 1, torch.float32, preprocess)
    from speculators.train.data import create_collate_fn

    return create_collate_fn(MAX_LEN, HIDDEN, preprocess)


def drafter(algorithm: str, verifier: Path):
    import transformers as tf

    draft = dict(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=256,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        rms_norm_eps=1e-6,
    )
    kwargs = dict(
        verifier_name_or_path=str(verifier),
        draft_vocab_size=VOCAB,
        norm_before_residual=False,
        ttt_steps=2,
        target_layer_ids=IDS[:-1],
        block_size=4,
        mask_token_id=VOCAB - 5,
        max_anchors=32,
        draft_attn_impl="eager",  # `--draft-attn-impl eager`: flex attention has no CPU backward
    )
    if algorithm == "eagle3":
        from speculators.models.eagle3.core import Eagle3DraftModel

        return Eagle3DraftModel.from_training_args(tf.LlamaConfig(**draft), **kwargs)
    from speculators.models.dflash.core import DFlashDraftModel

    return DFlashDraftModel.from_training_args(tf.Qwen3Config(**draft), **kwargs)


def call_kwargs(model, algorithm: str) -> dict:
    getter = getattr(type(model), "get_trainer_kwargs", None)
    if getter is None:
        return {"ttt_steps": 2} if algorithm == "eagle3" else {}
    args: dict[str, Any] = dict(ttt_steps=2, ttt_step_loss_decay=1.0, max_anchors=32)
    args["loss_implementation"] = "eager"  # `--loss-implementation eager`: fused needs Triton
    args["loss_fn"] = "kl_div" if algorithm == "eagle3" else "ce"
    train, _val = getter(**args)
    return train


# Passes over the 16 samples (4 batches each): EAGLE-3's two TTT steps cost ~7x DFlash's step
# on the CPU, and its loss falls faster; SPECULATORS_HYBRID_CPU_STEPS overrides both.
STEPS = {"eagle3": 24, "dflash": 40}
TRAINS = VERSION >= Version("0.9.0")  # draft_attn_impl / loss_implementation for CPUs


def samples_in(batch: dict) -> int:
    if "document_ids" in batch:  # 0.7+: lengths became per-position document ids
        assert batch.get("error_records", 0) == 0
        return int(batch["document_ids"].max()) + 1
    return int(batch["lengths"].numel())


@pytest.mark.skipif(
    not TRAINS, reason="trains on the newest release only (CI time; eager attention and loss)"
)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_drafter_overfits_our_files(prepared, served, target, algorithm, patched):
    """speculators' loader, collate and drafter forward on our files: loss finite, falling."""
    from torch.utils.data import DataLoader

    torch.manual_seed(0)
    loader = DataLoader(
        dataset(prepared), batch_size=4, shuffle=False, collate_fn=collate(algorithm)
    )
    batches = list(loader)
    assert sum(samples_in(b) for b in batches) == SAMPLES  # every sample arrived, none dropped
    # What the drafter is fed is our rows: ids[:-1] side by side, the last id as its target
    # (EAGLE-3's shift pairs token t+1 with the states of t).
    rows = served[1][0][3].float()
    n = len(rows) - (algorithm == "eagle3")
    fed = batches[0]
    assert fed["hidden_states"].shape[-1] == (len(IDS) - 1) * HIDDEN
    assert torch.equal(fed["hidden_states"][0, :n], rows[:n, :-1].flatten(1))
    assert torch.equal(fed["verifier_last_hidden_states"][0, :n], rows[len(rows) - n :, -1])
    model = drafter(algorithm, target).float()
    kwargs = call_kwargs(model, algorithm)
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=3e-3)
    losses = []
    start = time.perf_counter()
    steps = int(os.environ.get("SPECULATORS_HYBRID_CPU_STEPS", STEPS[algorithm]))
    for step in range(steps):
        batch = {k: v for k, v in batches[step % len(batches)].items()}
        _draft, loss, _metrics = model(**batch, **kwargs)
        assert torch.isfinite(loss), (step, loss)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        opt.step()
        losses.append(loss.item())
    rate = steps * 4 / (time.perf_counter() - start)
    first = sum(losses[: len(batches)]) / len(batches)
    last = sum(losses[-len(batches) :]) / len(batches)
    print(f"{algorithm}: loss {first:.4f} -> {last:.4f}, {steps} steps, {rate:.1f} samples/s")
    assert last < 0.7 * first, losses
