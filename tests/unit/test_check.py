"""`speculators-hybrid check` on real safetensors files (needs torch; speculators not needed)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from safetensors.torch import save_file  # noqa: E402

from speculators_hybrid import check  # noqa: E402

TOKENS, IDS, HIDDEN = 12, 4, 16


def states(tokens: int = TOKENS, ids: int = IDS, hidden: int = HIDDEN, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(tokens, ids, hidden, generator=gen).to(torch.bfloat16)


def write(path, hs=None, token_ids=None, metadata=None, **extra) -> str:
    hs = states() if hs is None else hs
    token_ids = torch.arange(hs.shape[0], dtype=torch.int64) if token_ids is None else token_ids
    tensors = {"hidden_states": hs, "token_ids": token_ids, **extra}
    tensors = {k: v for k, v in tensors.items() if v is not False}
    save_file(tensors, str(path), metadata=metadata)
    return str(path)


def run(capsys, *argv: str) -> tuple[int, str]:
    code = check.main(list(argv))
    return code, capsys.readouterr().out


def codes(report: check.FileReport) -> set[str]:
    return {e["code"] for e in report.errors}


def test_clean_files_pass(tmp_path, capsys):
    for i in range(3):
        write(tmp_path / f"hs_{i}.safetensors", states(seed=i))
    code, out = run(capsys, str(tmp_path))
    assert code == 0, out
    assert "FAILED" not in out and "files                3" in out
    code, out = run(capsys, str(tmp_path), "--json")
    doc = json.loads(out)
    assert code == 0 and doc["summary"]["ok"] == 3 and doc["summary"]["tokens"] == 3 * TOKENS
    assert doc["summary"]["shapes"] == {f"{IDS}x{HIDDEN}": 3}
    assert all(f["ok"] and f["n_ids"] == IDS for f in doc["files"])


def _nan():
    hs = states()
    hs[5, 1, 3] = float("nan")
    return hs


def _inf():
    hs = states()
    hs[11, 0, 0] = float("inf")
    return hs


def _zero_row():
    hs = states()
    hs[7] = 0
    return hs


def _zero_layer():
    hs = states()
    hs[:, 3] = 0
    return hs


def _zero_vector():
    hs = states()
    hs[2, 1] = 0
    return hs


BAD = {
    "no_hidden_states": (dict(hidden_states=False), "missing_key"),
    "no_token_ids": (dict(token_ids=False), "missing_key"),
    "token_ids_int32": (dict(token_ids=torch.arange(TOKENS, dtype=torch.int32)), "bad_dtype"),
    "hidden_int": (dict(hs=torch.ones(TOKENS, IDS, HIDDEN, dtype=torch.int16)), "bad_dtype"),
    "hidden_2d": (dict(hs=states()[:, 0].contiguous()), "bad_shape"),
    "length": (dict(token_ids=torch.arange(TOKENS - 1)), "length_mismatch"),
    "nan": (dict(hs=_nan()), "non_finite"),
    "inf": (dict(hs=_inf()), "non_finite"),
    "zero_row": (dict(hs=_zero_row()), "zero_rows"),
    "all_zero": (dict(hs=torch.zeros(TOKENS, IDS, HIDDEN, dtype=torch.bfloat16)), "zero_rows"),
    "zero_layer": (dict(hs=_zero_layer()), "zero_layers"),
    "zero_vector": (dict(hs=_zero_vector()), "zero_vectors"),
    "empty": (dict(hs=states(tokens=0)), "empty"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_each_bad_case_is_named_with_its_reason(tmp_path, capsys, case):
    kwargs, expected = BAD[case]
    good = write(tmp_path / "hs_0.safetensors")
    kwargs = dict(kwargs)
    bad = write(tmp_path / "hs_1.safetensors", kwargs.pop("hs", None), **kwargs)
    assert expected in codes(check.check_file(bad))
    assert check.check_file(good).ok
    code, out = run(capsys, str(tmp_path))
    assert code == 1
    failed = [line for line in out.splitlines() if line.startswith("FAILED")]
    assert len(failed) == 1 and failed[0].startswith(f"FAILED {bad}: ")


def test_reasons_say_where(tmp_path):
    report = check.check_file(write(tmp_path / "a.safetensors", _zero_row()))
    assert report.errors[0]["message"] == "1 of 12 token rows are all zero (first at tokens [7])"
    report = check.check_file(write(tmp_path / "b.safetensors", _zero_layer()))
    assert report.errors[0]["message"] == "layer slots [3] are zero for every token"
    report = check.check_file(write(tmp_path / "c.safetensors", _nan()))
    assert report.errors[0]["message"] == "1 NaN and 0 Inf values (first at tokens [5])"


def test_values_are_scanned_in_row_chunks(tmp_path):
    hs = states(tokens=50)
    hs[41] = 0
    hs[49, 2, 7] = float("nan")
    path = write(tmp_path / "long.safetensors", hs)
    row_bytes = IDS * HIDDEN * 2
    for chunk in (row_bytes, 3 * row_bytes, 1 << 30):  # 1 row, 3 rows, whole tensor
        report = check.check_file(path, chunk=chunk)
        messages = [e["message"] for e in report.errors]
        assert messages == [
            "1 NaN and 0 Inf values (first at tokens [49])",
            "1 of 50 token rows are all zero (first at tokens [41])",
        ], chunk


def test_unreadable_files_are_reported_not_raised(tmp_path, capsys):
    good = write(tmp_path / "hs_0.safetensors")
    data = open(good, "rb").read()
    (tmp_path / "hs_1.safetensors").write_bytes(data[: len(data) - 100])  # truncated
    (tmp_path / "hs_2.safetensors").write_bytes(b"not a safetensors file")
    (tmp_path / "hs_3.safetensors").write_bytes(b"")
    code, out = run(capsys, str(tmp_path))
    assert code == 1
    failed = {line.split(":")[0].split()[1] for line in out.splitlines() if "FAILED" in line}
    assert failed == {str(tmp_path / f"hs_{i}.safetensors") for i in (1, 2, 3)}
    for i in (1, 2, 3):
        assert codes(check.check_file(str(tmp_path / f"hs_{i}.safetensors"))) == {"unreadable"}
    said = {
        i: check.check_file(str(tmp_path / f"hs_{i}.safetensors")).errors[0]["message"]
        for i in (1, 2, 3)
    }
    assert said[1].startswith("cut short: tensor ")
    assert said[2].startswith("not a safetensors file: its first 8 bytes give a ")
    assert said[3] == "not a safetensors file: 0 bytes, shorter than a header"


def test_a_missing_path_is_a_usage_error(tmp_path, capsys):
    write(tmp_path / "hs_0.safetensors")
    code = check.main([str(tmp_path), str(tmp_path / "missing.safetensors")])
    err = capsys.readouterr().err
    assert code == 2
    missing = tmp_path / "missing.safetensors"
    assert err == f"speculators-hybrid check: error: no such file or folder: {missing}\n"


def test_rejected_files_fail_with_their_reason(tmp_path, capsys):
    write(tmp_path / "hs_0.safetensors")
    (tmp_path / "hs_1.safetensors.rejected").write_text("2 of 12 token rows are all zero")
    code, out = run(capsys, str(tmp_path))
    assert code == 1
    marker = tmp_path / "hs_1.safetensors.rejected"
    assert (
        f"FAILED {tmp_path}/hs_1.safetensors: not written, {marker} says: 2 of 12 token rows "
        "are all zero"
    ) in out.splitlines()
    # named directly: the file that is not there, reported by its marker
    code, out = run(capsys, str(tmp_path / "hs_1.safetensors"))
    assert code == 1 and "problems             rejected (1)" in out


def test_a_file_whose_layers_or_width_differ_from_the_rest_is_flagged(tmp_path, capsys):
    for i in range(3):
        write(tmp_path / f"hs_{i}.safetensors", states(seed=i))
    odd = write(tmp_path / "hs_3.safetensors", states(ids=3))
    assert check.main([str(tmp_path), "--json"]) == 1
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    bad = [f for f in doc["files"] if not f["ok"]]
    assert [f["path"] for f in bad] == [odd]
    assert captured.err.startswith(f"FAILED {odd}: ")
    assert bad[0]["errors"][0] == {
        "code": "inconsistent_shape",
        "message": "3 layer ids x 16 hidden; 3 of 4 files have 4 x 16",
    }


@pytest.mark.parametrize(
    ("metadata", "bad"),
    [
        ({"vllm_version": "0.24.0"}, True),
        ({"vllm_version": "0.24.1+cu129", "speculators_hybrid_patches": "a,b"}, True),
        (
            {"vllm_version": "0.24.0", "speculators_hybrid_patches": "hidden-states-read-slots"},
            False,
        ),
        (
            {
                "vllm_version": "0.24.0",
                "speculators_hybrid_patches": '["hidden-states-read-slots"]',
            },
            False,
        ),
        ({"vllm_version": "0.25.0"}, False),
        (
            {"vllm_version": "0.20.1", "speculators_hybrid_patches": "keep-hma-for-extraction"},
            False,
        ),
        ({}, False),
    ],
)
def test_known_bad_provenance_is_flagged(tmp_path, metadata, bad):
    report = check.check_file(write(tmp_path / "hs_0.safetensors", metadata=metadata))
    assert ("bad_provenance" in codes(report)) is bad
    assert report.metadata == metadata


def test_folders_are_walked_in_natural_order_and_only_safetensors_count(tmp_path):
    for i in (10, 2, 1):
        write(tmp_path / f"hs_{i}.safetensors")
    (tmp_path / "sub").mkdir()
    write(tmp_path / "sub" / "hs_0.safetensors")
    (tmp_path / "hs_3.safetensors.lock").write_text("")
    (tmp_path / "hs_4.safetensors.77.part").write_text("")
    (tmp_path / "hs_5.safetensors.rejected").write_text("why")
    found = [os.path.relpath(p, tmp_path) for p in check.find_files([str(tmp_path)], True)]
    assert found == [
        "hs_1.safetensors",
        "hs_2.safetensors",
        "hs_5.safetensors.rejected",
        "hs_10.safetensors",
        "sub/hs_0.safetensors",
    ]


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_only_on_a_terminal(monkeypatch):
    pytest.importorskip("tqdm")
    for stream in (_Tty(), io.StringIO()):
        monkeypatch.setattr(check.sys, "stderr", stream)
        bar = check.progress(4)
        for _ in range(4):
            bar.set_postfix(failed=1, refresh=False)
            bar.update()
        bar.close()
        shown = stream.getvalue()
        assert ("4/4" in shown and "failed=1" in shown) if stream.isatty() else shown == ""


def test_thousands_of_files_stream_through(tmp_path, capsys):
    hs, ids = states(tokens=4, ids=2, hidden=8), torch.arange(4)
    for i in range(3000):
        save_file({"hidden_states": hs, "token_ids": ids}, str(tmp_path / f"hs_{i}.safetensors"))
    start = time.monotonic()
    code, out = run(capsys, str(tmp_path))
    elapsed = time.monotonic() - start
    assert code == 0 and "files                3000" in out
    assert elapsed < 60, elapsed


def test_nothing_to_check_is_a_usage_error(tmp_path, capsys):
    assert check.main([str(tmp_path)]) == 2


class TestDataset:
    @pytest.fixture
    def data(self, tmp_path):
        datasets = pytest.importorskip("datasets")
        rows = [[5, 6, 7, 8], [9, 10, 11], [1, 2, 3, 4, 5]]
        ds = datasets.Dataset.from_dict(
            {
                "input_ids": rows,
                "loss_mask": [[0] + [1] * (len(r) - 1) for r in rows],
                "seq_len": [len(r) for r in rows],
            }
        )
        ds.set_format(type="torch")  # as speculators' preprocessing saves it
        ds.save_to_disk(str(tmp_path / "data"))
        hs_dir = tmp_path / "data" / "hidden_states"
        hs_dir.mkdir()
        for i, r in enumerate(rows):
            write(hs_dir / f"hs_{i}.safetensors", states(tokens=len(r)), torch.tensor(r))
        return tmp_path / "data", hs_dir, rows

    def test_matching_files_pass(self, data, capsys):
        root, hs_dir, rows = data
        code, out = run(capsys, str(hs_dir), "--dataset", str(root), "--json")
        doc = json.loads(out)
        assert code == 0, out
        assert doc["summary"]["dataset"]["samples_with_a_file"] == 3
        assert [f["sample"] for f in doc["files"]] == [0, 1, 2]

    def test_token_ids_must_equal_the_samples_input_ids(self, data, capsys):
        root, hs_dir, rows = data
        write(hs_dir / "hs_1.safetensors", states(tokens=3), torch.tensor([9, 10, 12]))
        write(hs_dir / "hs_7.safetensors", states(tokens=3), torch.tensor([9, 10, 11]))
        write(hs_dir / "req-abc.safetensors", states(tokens=3), torch.tensor([9, 10, 11]))
        code, out = run(capsys, str(hs_dir), "--dataset", str(root))
        assert code == 1
        assert (
            f"FAILED {hs_dir / 'hs_1.safetensors'}: token_ids differ from sample 1's input_ids "
            "(3 vs 3 tokens, first difference at token 2)"
        ) in out
        assert f"FAILED {hs_dir / 'hs_7.safetensors'}: sample 7 is not in the dataset" in out
        assert "req-abc" not in out.split("FAILED", 1)[1]  # unlinked: a warning only
        assert "unlinked (1)" in out

    def test_bad_dataset_is_a_usage_error(self, data, tmp_path, capsys):
        root, hs_dir, rows = data
        assert check.main([str(hs_dir), "--dataset", str(tmp_path / "nope")]) == 2
        datasets = pytest.importorskip("datasets")
        datasets.Dataset.from_dict({"input_ids": [[1]]}).save_to_disk(str(tmp_path / "no_mask"))
        assert check.main([str(hs_dir), "--dataset", str(tmp_path / "no_mask")]) == 2
        assert "no column loss_mask" in capsys.readouterr().err


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """`check` as a user runs it, reporting whether torch was imported."""
    code = (
        "import sys; from speculators_hybrid.cli import main; code = main(sys.argv[1:]); "
        "print('torch imported' if 'torch' in sys.modules else 'no torch', file=sys.stderr); "
        "sys.exit(code)"
    )
    return subprocess.run(
        [sys.executable, "-c", code, "check", *args], capture_output=True, text=True, timeout=120
    )


def test_cli_reads_files_without_torch_and_says_what_is_wrong(tmp_path):
    write(tmp_path / "hs_0.safetensors")
    (tmp_path / "notes.txt").write_text("hello")
    done = cli(str(tmp_path), str(tmp_path / "notes.txt"))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f"FAILED {tmp_path}/notes.txt: not a safetensors file: " in done.stdout
    assert "files                2" in done.stdout
    assert done.stderr.splitlines()[-1] == "no torch"

    done = cli(str(tmp_path / "nope"))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines()[0] == (
        f"speculators-hybrid check: error: no such file or folder: {tmp_path}/nope"
    )


def test_cli_dataset_errors_are_usage_errors(tmp_path):
    write(tmp_path / "hs_0.safetensors")
    done = cli(str(tmp_path), "--dataset", str(tmp_path / "no-such-data"))
    assert done.returncode == 2
    assert done.stderr.startswith("speculators-hybrid check: error: --dataset ")
    assert "no such folder" in done.stderr.splitlines()[0]
    try:
        import datasets  # noqa: F401
    except ImportError:
        done = cli(str(tmp_path), "--dataset", str(tmp_path))
        assert done.returncode == 2
        assert "needs the `datasets` package: pip install './speculators-hybrid[check]'" in (
            done.stderr
        )


def test_known_bad_writers_name_the_patches_that_fix_them():
    """A known-bad writer's `fixes` are ids of our vLLM patches needed by exactly those releases
    (renaming a patch or changing its range breaks `check`'s verdict otherwise)."""
    from packaging.specifiers import SpecifierSet

    from speculators_hybrid.support import VLLM
    from speculators_hybrid.vllm_patches import PATCHES

    by_id = {p.id: p for p in PATCHES}
    for bad in check.KNOWN_BAD:
        assert bad.fixes and bad.fixes <= set(by_id), bad.fixes
        bad_releases = [v for v in VLLM if v in SpecifierSet(bad.vllm)]
        assert bad_releases, bad.vllm
        for fix in bad.fixes:
            assert [v for v in VLLM if by_id[fix].needed_for(v)] == bad_releases, fix


def test_the_check_extra_holds_what_check_imports():
    from importlib import metadata

    from packaging.requirements import Requirement

    wanted = [Requirement(r) for r in metadata.requires("speculators-hybrid") or []]
    extra = {r.name for r in wanted if r.marker and r.marker.evaluate({"extra": "check"})}
    assert {"numpy", "datasets"} <= extra


def test_cli_refuses_a_negative_token_id_and_a_mix_of_dtypes(tmp_path):
    write(tmp_path / "hs_0.safetensors", token_ids=torch.tensor([5, -5, 7] + [1] * 9))
    done = cli(str(tmp_path / "hs_0.safetensors"))
    assert done.returncode == 1
    assert "token_ids holds negative ids (at tokens [1])" in done.stdout

    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for i in range(3):
        write(mixed / f"hs_{i}.safetensors", hs=states(seed=i))
    write(mixed / "hs_3.safetensors", hs=states(seed=3).float())
    done = cli(str(mixed))
    assert done.returncode == 1
    assert f"FAILED {mixed}/hs_3.safetensors: hidden_states is F32; 3 of 4 files are BF16" in (
        done.stdout
    )
    assert done.stdout.count("FAILED") == 1


def test_cli_says_a_folder_of_lock_files_is_unfinished(tmp_path):
    (tmp_path / "hs_0.safetensors.lock").write_text("")
    (tmp_path / "hs_1.safetensors.lock").write_text("")
    done = cli(str(tmp_path))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines()[0] == (
        "speculators-hybrid check: error: no .safetensors files found, only 2 .lock files: the "
        "writer has not finished those files (or stopped before it did); wait for it, or see "
        "the server's log"
    )


def test_cli_names_a_folder_with_no_files(tmp_path):
    done = cli(str(tmp_path))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines()[0] == (
        f"speculators-hybrid check: error: no .safetensors files in {tmp_path}: give the "
        "server's output folder"
    )


def test_cli_checks_verify_with_before_reading_any_file(tmp_path):
    write(tmp_path / "hs_0.safetensors")
    start = time.monotonic()
    done = cli(str(tmp_path), "--verify-with", str(tmp_path / "no-model"))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines()[0] == (
        f"speculators-hybrid check: error: --verify-with {tmp_path}/no-model: no config.json "
        "there; give the model's folder (weights + config)"
    )
    assert time.monotonic() - start < 30


def test_cli_jobs_give_the_same_report_in_the_same_order(tmp_path):
    for i in range(7):
        hs = states(seed=i)
        if i == 2:
            hs[3, 1, 5] = float("nan")
        if i == 5:
            hs[:, 2] = 0
        write(tmp_path / f"hs_{i}.safetensors", hs=hs)
    one = cli(str(tmp_path), "--jobs", "1", "--json")
    many = cli(str(tmp_path), "--jobs", "3", "--json")
    assert one.returncode == many.returncode == 1
    assert json.loads(one.stdout) == json.loads(many.stdout)
    failed = [f["path"] for f in json.loads(many.stdout)["files"] if not f["ok"]]
    assert failed == [str(tmp_path / "hs_2.safetensors"), str(tmp_path / "hs_5.safetensors")]
    done = cli(str(tmp_path), "--jobs", "0")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines()[0] == (
        "speculators-hybrid check: error: --jobs 0: give 1 or more files at a time"
    )


@pytest.mark.parametrize(
    "dtype",
    ["bfloat16", "float16", "float32", "float64", "float8_e4m3fn", "float8_e5m2"],
)
def test_every_float_dtype_is_scanned_by_its_bits(dtype, tmp_path):
    """NaN and Inf of either sign, -0.0 counted as zero, tiny (subnormal) values as used: the
    counts torch gives, in every dtype the files may hold, with chunks of 1 and 3 rows."""
    kind = getattr(torch, dtype)
    hs = states(tokens=20).double()
    hs[2, 1, 3] = float("nan")
    hs[4, 0, 0] = -float("nan")
    hs[6] = -0.0  # a zero row, its sign bits set
    hs[8, 3] = 0.0  # a zero (token, slot) vector
    hs[8, 2] = 0.0
    hs[8, 2, 5] = torch.finfo(kind).tiny / 2  # a subnormal: the vector is not zero
    if dtype != "float8_e4m3fn":  # it has no Inf
        hs[10, 1, 1] = float("inf")
        hs[12, 2, 2] = -float("inf")
    hs = hs.to(kind)
    assert hs[8, 2, 5] != 0  # a subnormal, not flushed to zero
    scales = {"hidden_states_scales": torch.ones(20, 1, 1)} if hs.element_size() == 1 else {}
    path = write(tmp_path / "x.safetensors", hs, **scales)  # float8: the fp8 backend's format
    hint = " (fp8 rounds a slot to zero where it is tiny beside the token's largest value)"
    hint = hint if scales else ""
    wide = hs.float()
    nan, inf = int(wide.isnan().sum()), int(wide.isinf().sum())
    bad = sorted({int(t) for t in (wide.isnan() | wide.isinf()).nonzero()[:, 0]})
    row = IDS * HIDDEN * hs.element_size()
    for chunk in (row, 3 * row):
        messages = [e["message"] for e in check.check_file(path, chunk=chunk).errors]
        assert messages == [
            f"{nan} NaN and {inf} Inf values (first at tokens {bad[:5]})",
            "1 of 20 token rows are all zero (first at tokens [6])",
            "1 (token, layer slot) vectors are all zero" + hint,
        ], (dtype, chunk)


def test_the_rate_benchmark_runs_on_small_files(tmp_path, capsys):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from benchmarks import check_rate

    folder = tmp_path / "files"
    args = ["--files", "3", "--tokens", "8", "--repeats", "1", "--jobs", "1", "2"]
    assert check_rate.main([*args, "--folder", str(folder), "--out", str(tmp_path / "out")]) == 0
    (result,) = (tmp_path / "out").glob("*.json")
    doc = json.loads(result.read_text())
    assert list(doc["results"]) == ["cat", "check --jobs 1", "check --jobs 2"]
    assert doc["bytes"] > 3 * 8 * 4 * 5120 * 2  # the files' sizes, headers included
    assert all(row["mb_per_s"] > 0 and row["files_per_s"] > 0 for row in doc["results"].values())
    assert not folder.exists()  # the files are removed unless --keep
    assert "check --jobs 2" in capsys.readouterr().out


def test_cli_names_the_folder_of_a_file_given_for_one(tmp_path):
    write(tmp_path / "hs_0.safetensors")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    for flag, given in (
        ("--verify-with", tmp_path / "model" / "config.json"),
        ("--dataset", tmp_path / "hs_0.safetensors"),
    ):
        done = cli(str(tmp_path / "hs_0.safetensors"), flag, str(given))
        assert done.returncode == 2 and done.stdout == ""
        assert done.stderr.splitlines()[0] == (
            f"speculators-hybrid check: error: {flag} {given} is a file: give its folder "
            f"({given.parent})"
        )
