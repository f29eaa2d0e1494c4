"""`speculators-hybrid verify` on tiny random hybrids: files written by an independent writer
(tests/verify/conftest.py) pass; each way a plausible-looking file can be wrong fails, by name."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    import torch
else:
    torch = pytest.importorskip("torch")

from conftest import IDS, Writer, cli, tokens, verify_json, write  # noqa: E402

LENGTH = 120
K = 16  # rows of another context at the start (shifted prefix), or without their context


def bad_states(case: str, writer: Writer, prompt: list[int]) -> torch.Tensor:
    """The hidden states of a file for `prompt` that is wrong in one way."""
    other = writer.states(tokens(99, LENGTH), IDS)
    good = writer.states(prompt, IDS)
    if case == "layer_off_by_one":  # each slot holds the layer before the one it names
        return writer.states(prompt, [i - 1 for i in IDS])
    if case == "rows_of_another_prompt":
        return other
    if case == "shifted_prefix":  # the first K rows come from another context (a bad cache hit)
        return torch.cat([other[:K], good[K:]])
    if case == "suffix_without_prefix":  # resumed after K tokens without their recurrent state
        return torch.cat([good[:K], writer.states(prompt[K:], IDS)])
    if case == "post_norm_last_layer":
        return writer.states(prompt, IDS, post_norm=True)
    if case == "truncated":
        return good[: LENGTH - 5]
    raise AssertionError(case)


# case -> (the ids that must fail, or None for a file-level error; that error's code)
BAD: dict[str, tuple[set[int] | None, str | None]] = {
    "layer_off_by_one": (set(IDS), None),
    "rows_of_another_prompt": (set(IDS), None),
    "shifted_prefix": (set(IDS), None),
    "suffix_without_prefix": (set(IDS), None),
    "post_norm_last_layer": ({8}, None),
    "truncated": (None, "length_mismatch"),
}
GOOD = {"one_token": 1, "inside_a_chunk": 47, "four_chunks": 150}


@pytest.fixture(scope="module")
def mixed(
    model_dir: Path, writer: Writer, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """One folder: good files and one file per bad case; verify run once over it (JSON)."""
    folder = tmp_path_factory.mktemp("mixed")
    for i, (name, n) in enumerate(GOOD.items()):
        prompt = tokens(i, n)
        write(folder / f"{name}.safetensors", prompt, writer.states(prompt, IDS))
    prompt = tokens(7, LENGTH)
    for case in BAD:
        write(folder / f"{case}.safetensors", prompt, bad_states(case, writer, prompt))
    code, doc, err = verify_json(folder, "--model", model_dir)
    files = {Path(f["path"]).stem: f for f in doc["files"]}
    return {"folder": folder, "code": code, "doc": doc, "err": err, "files": files}


def test_good_files_pass(mixed: dict[str, Any]) -> None:
    """Lengths 1, 47 (inside a chunk) and 150 (four chunks) pass with room to spare."""
    assert mixed["code"] == 1  # the bad ones
    assert mixed["doc"]["summary"]["verified"] == len(GOOD) + len(BAD)
    for name in GOOD:
        f = mixed["files"][name]
        assert f["ok"] and f["ids_from"] == "metadata" and f["dtype"] == "bfloat16", f
        assert f"{name}.safetensors" not in mixed["err"]
        for r in f["per_id"]:
            # a bf16 writer is about as far from float32 as the bf16 floor: well inside the limit
            assert 1 - r["similarity"] <= 1.5 * (1 - r["floor"]) + 1e-5, (name, r)
    assert set(mixed["doc"]["summary"]["per_id"]) == {str(i) for i in IDS}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_file_fails(mixed: dict[str, Any], case: str) -> None:
    path = mixed["folder"] / f"{case}.safetensors"
    assert f"FAILED {path}: " in mixed["err"]
    result = mixed["files"][case]
    assert not result["ok"]
    failing, error = BAD[case]
    if error:
        assert [e["code"] for e in result["errors"]] == [error]
        return
    assert {r["id"] for r in result["per_id"] if not r["ok"]} == failing
    worst = min(result["per_id"], key=lambda r: r["similarity"])
    if case == "shifted_prefix":
        assert worst["token"] < K
    if case == "suffix_without_prefix":
        assert worst["token"] >= K
    # far outside the limit, not at its edge
    assert 1 - worst["similarity"] > 10 * (1 - worst["limit"]), worst


def test_float32_rounded_file_passes(model_dir: Path, reference, tmp_path: Path) -> None:
    """A float32 computation stored in bf16 (closer to the truth than the floor) passes."""
    from speculators_hybrid.verify import capture
    from speculators_hybrid.verify.files import Verifier

    prompt = tokens(5, 64)
    states = capture.hidden_states(reference, prompt, IDS, torch.float32).bfloat16()
    result = Verifier(reference).verify(write(tmp_path / "f32.safetensors", prompt, states))
    assert result.ok, result.reasons()


def test_text_output_streams_and_names_bad_files(
    model_dir: Path, writer: Writer, tmp_path: Path
) -> None:
    prompt = tokens(3, 20)
    a = write(tmp_path / "a" / "hs_0.safetensors", prompt, writer.states(prompt, IDS))
    post = writer.states(prompt, IDS, post_norm=True)
    b = write(tmp_path / "b" / "hs_1.safetensors", prompt, post)
    code, out, err = cli("verify", tmp_path, "--model", model_dir, "--device", "cpu")
    assert code == 1
    lines = out.splitlines()
    assert lines[0].startswith("verify: 2 of 2 files (seed 0)")
    assert lines[1].startswith(f"ok    {a}  file backend, 20 tokens, ids [1, 4, 5, 8]: worst id")
    assert lines[2].startswith(f"FAIL  {b}  file backend, id 8: similarity")
    assert "verify: 1 of 2 files pass (2 found, seed 0), 1 failed" in out
    assert f"FAILED {b}: id 8:" in out
    assert "Traceback" not in err


def test_sample_is_seeded(model_dir: Path, writer: Writer, tmp_path: Path) -> None:
    from speculators_hybrid.verify.command import choose

    files = [f"hs_{i}" for i in range(100)]
    first = choose(files, 5, None, 1)
    assert len(first) == 5 and first == choose(files, 5, None, 1) != choose(files, 5, None, 2)
    assert first == sorted(first, key=files.index)  # in the files' own order
    assert len(choose(files, None, 0.025, 0)) == 3  # ceil(2.5)
    assert len(choose(files, None, None, 0)) == 32  # the default
    assert choose(files[:10], None, None, 0) == files[:10]
    prompt = tokens(4, 8)
    states = writer.states(prompt, IDS)
    for i in range(4):
        write(tmp_path / f"hs_{i}.safetensors", prompt, states)
    code, doc, _ = verify_json(tmp_path, "--model", model_dir, "--sample", "2", "--seed", "3")
    expected = choose(sorted(str(p) for p in tmp_path.iterdir()), 2, None, 3)
    assert code == 0 and [f["path"] for f in doc["files"]] == expected


def test_layer_ids_come_from_ids_metadata_or_default(
    reference, writer: Writer, tmp_path: Path
) -> None:
    from speculators_hybrid.verify.files import Verifier

    prompt = tokens(6, 30)
    verifier = Verifier(reference)
    # no metadata, 4 slots: speculators' default [2, n//2, n-3, n] = [2, 4, 5, 8]
    default = write(
        tmp_path / "default.safetensors", prompt, writer.states(prompt, [2, 4, 5, 8]), None
    )
    result = verifier.verify(default)
    assert result.ok and result.ids_from == "speculators' default", result.reasons()
    # 3 slots and no metadata: no guess
    three = write(tmp_path / "three.safetensors", prompt, writer.states(prompt, [0, 3, 8]), None)
    result = verifier.verify(three)
    assert [e["code"] for e in result.errors] == ["ids_mismatch"]
    assert "give the server's ids with --ids" in result.reasons()[0]
    result = Verifier(reference, ids=[0, 3, 8]).verify(three)
    assert result.ok and result.ids_from == "--ids", result.reasons()
    # metadata ids that do not fit the model
    high = write(tmp_path / "high.safetensors", prompt, writer.states(prompt, IDS), [1, 4, 5, 9])
    assert [e["code"] for e in verifier.verify(high).errors] == ["bad_ids"]
    # a width other than the config's hidden size
    wide = write(tmp_path / "w.safetensors", [1, 2, 3], torch.ones(3, 4, 128, dtype=torch.bfloat16))
    result = verifier.verify(wide)
    assert [e["code"] for e in result.errors] == ["width_mismatch"]
    assert "the model's hidden size is 256" in result.reasons()[0]


def test_multimodal_checkpoint(multimodal_dir: Path, tmp_path: Path) -> None:
    """Qwen3_5ForConditionalGeneration: the text stack is found under model.language_model."""
    mm = Writer(multimodal_dir)
    prompt = tokens(8, 24)
    write(tmp_path / "good.safetensors", prompt, mm.states(prompt, [0, 4, 8]), [0, 4, 8])
    write(tmp_path / "bad.safetensors", prompt, mm.states(prompt, [0, 3, 7]), [0, 4, 8])
    code, doc, err = verify_json(tmp_path, "--model", multimodal_dir)
    assert code == 1
    assert [Path(f["path"]).name for f in doc["files"] if not f["ok"]] == ["bad.safetensors"]


def test_bad_input_is_one_line(model_dir: Path, tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("not safetensors")
    empty = tmp_path / "empty"
    empty.mkdir()
    good = write(tmp_path / "ok" / "x.safetensors", tokens(0, 4), torch.ones(4, 4, 256))
    cases = [
        ([tmp_path / "missing.safetensors", "--model", model_dir], "does not exist"),
        ([text, "--model", model_dir], "is not a safetensors file"),
        ([empty, "--model", model_dir], "no .safetensors files under"),
        ([good, "--model", tmp_path / "nope"], "is not a folder"),
        ([good, "--model", empty], "has no config.json"),
        ([good, "--model", model_dir, "--ids", "1", "9"], "outside [0, 8]"),
        ([good, "--model", model_dir, "--sample", "0"], "--sample must be at least 1"),
        ([good, "--model", model_dir, "--fraction", "2"], "--fraction must be within"),
    ]
    for argv, message in cases:
        code, out, err = cli("verify", *argv, "--device", "cpu")
        assert code == 2, (argv, out, err)
        assert (
            err.count("\n") == 1
            and message in err
            and err.startswith("speculators-hybrid verify: error: ")
        ), err
    config_only = tmp_path / "config_only"
    config_only.mkdir()
    (config_only / "config.json").write_text((model_dir / "config.json").read_text())
    code, _, err = cli("verify", good, "--model", config_only, "--device", "cpu")
    assert (
        code == 2
        and err.startswith("speculators-hybrid verify: error: cannot load")
        and err.count("\n") == 1
    ), err
    code, _, err = cli("verify", good, "--model", model_dir, "--device", "tpu")
    assert (
        code == 2
        and err
        == "speculators-hybrid verify: error: --device tpu: verify runs on cpu or cuda[:N]\n"
    ), err


def test_missing_transformers_names_the_install(tmp_path: Path) -> None:
    """Without transformers the command says what to install (an interpreter that cannot
    import it)."""
    import subprocess
    import sys

    path = write(tmp_path / "x.safetensors", [1], torch.ones(1, 4, 256))
    code = (
        "import sys; sys.modules['transformers'] = None\n"
        "from speculators_hybrid.cli import main\n"
        f"sys.exit(main(['verify', {str(path)!r}, '--model', {str(tmp_path)!r}]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        "speculators-hybrid verify: error: needs transformers: "
        "pip install './speculators-hybrid[verify]' "
        "(the clone's folder; torch, transformers >= 5.6, tqdm)\n"
    )


def test_check_verify_with(model_dir: Path, writer: Writer, tmp_path: Path) -> None:
    """`check --verify-with`: the static checks, then verify on the files that passed them."""
    import json

    prompt = tokens(9, 16)
    good = write(tmp_path / "hs_0.safetensors", prompt, writer.states(prompt, IDS))
    post = write(tmp_path / "hs_1.safetensors", prompt, writer.states(prompt, IDS, post_norm=True))
    zero = write(tmp_path / "hs_2.safetensors", prompt, torch.zeros(16, 4, 256))
    code, out, err = cli("check", tmp_path, "--verify-with", model_dir)
    assert code == 1
    assert f"FAILED {zero}: every hidden state is zero" in out  # check's own
    assert "verify: 2 of 2 files (seed 0)" in out  # only the two that passed check
    assert f"FAILED {post}: id 8:" in out and f"FAILED {good}" not in out
    code, out, err = cli("check", tmp_path, "--json", "--verify-with", model_dir)
    doc = json.loads(out)
    assert code == 1 and doc["summary"]["failed"] == 1
    assert [f["ok"] for f in doc["verify"]["files"]] == [True, False]
    code, out, err = cli("check", good, "--verify-with", tmp_path / "nope")
    assert code == 2 and err.endswith(
        "no config.json there; give the model's folder (weights + config)\n"
    )


def test_malformed_files_fail_by_code(reference, tmp_path: Path) -> None:
    """Files that are not the contract fail with a code, never a traceback."""
    from safetensors.torch import save_file

    from speculators_hybrid.verify.files import Verifier

    verifier = Verifier(reference)
    h = torch.ones(3, 4, 256, dtype=torch.bfloat16)
    cases = {
        "missing_key": {"hidden_states": h},
        "bad_tokens": {"hidden_states": h, "token_ids": torch.tensor([1, 2, 5000])},
        "empty": {"hidden_states": torch.ones(0, 4, 256), "token_ids": torch.zeros(0).long()},
        "length_mismatch": {"hidden_states": h, "token_ids": torch.zeros(0).long()},
        "bad_shape": {"hidden_states": torch.ones(3, 256), "token_ids": torch.tensor([1, 2, 3])},
    }
    for code, tensors in cases.items():
        path = tmp_path / f"{code}.safetensors"
        save_file(tensors, str(path))
        assert code in {e["code"] for e in verifier.verify(path).errors}, code
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes((tmp_path / "bad_tokens.safetensors").read_bytes()[:50])
    assert [e["code"] for e in verifier.verify(broken).errors] == ["unreadable"]


def test_capture_is_transformers_own_states(reference) -> None:
    """verify's hooks give exactly transformers' hidden states (ids < n) and the final norm's
    input (id n), in float32; a float32 pass leaves the stored bf16 weights as they were."""
    from speculators_hybrid.verify import capture

    before = {k: v.clone() for k, v in reference.state_dict().items()}
    prompt = tokens(11, 40)
    ids = list(range(9))
    got = capture.hidden_states(reference, prompt, ids, torch.float32)
    assert got.dtype == torch.float32
    after = reference.state_dict()
    assert all(
        torch.equal(before[k], after[k]) and before[k].dtype == after[k].dtype for k in before
    )
    model32 = type(reference)(reference.config).eval()
    model32.load_state_dict({k: v.float() for k, v in before.items()})
    seen: list[torch.Tensor] = []
    hook = model32.model.norm.register_forward_pre_hook(lambda m, a: seen.append(a[0]))
    with torch.no_grad():
        out = model32(input_ids=torch.tensor([prompt]), output_hidden_states=True)
    hook.remove()
    expected = torch.stack([*out.hidden_states[:8], seen[0]], dim=2)[0]
    torch.testing.assert_close(got, expected, rtol=0, atol=0)  # bit for bit
    assert not torch.allclose(out.hidden_states[8][0], seen[0][0])  # HF's last is post-norm


def test_the_stated_rule_is_the_applied_one() -> None:
    """The help text and docs state the constants rule.py applies."""
    import speculators_hybrid.verify as verify
    from speculators_hybrid.verify import rule

    assert (rule.K, rule.EPS) == (3, 1e-4)
    assert "e_file <= 3 * e_floor + 1e-4" in (verify.__doc__ or "")
    docs = Path(__file__).parents[2] / "docs" / "verify.md"
    assert "e_file <= K * e_floor + EPS,    K = 3,  EPS = 1e-4" in docs.read_text()
    assert rule.limit(0.99791) == pytest.approx(1 - (3 * 0.00209 + 1e-4))
    # the measured H200 numbers: correct vLLM files pass their floors, the bad hit fails
    floors = [0.99966, 0.99916, 0.99891, 0.99791]
    for floor, good in zip(floors, [0.99963, 0.99917, 0.99895, 0.99789], strict=True):
        assert good >= rule.limit(floor)
        assert 0.79 < rule.limit(floor)


def test_nan_file_fails_and_json_stays_json(
    model_dir: Path, writer: Writer, tmp_path: Path
) -> None:
    import json

    prompt = tokens(12, 10)
    states = writer.states(prompt, IDS).clone()
    states[3, 2] = float("nan")
    path = write(tmp_path / "nan.safetensors", prompt, states)
    code, out, err = cli("verify", path, "--model", model_dir, "--json", "--device", "cpu")

    def refuse(name: str) -> None:
        raise AssertionError(f"{name} in the JSON")

    doc = json.loads(out, parse_constant=refuse)
    assert code == 1 and f"FAILED {path}: id 5: token 3 is all zeros or not finite" in err
    assert doc["summary"]["per_id"]["5"]["worst"] is None


def test_a_zero_row_fails_without_a_made_up_similarity(
    model_dir: Path, writer: Writer, tmp_path: Path
) -> None:
    prompt = tokens(12, 10)
    states = writer.states(prompt, IDS).clone()
    states[4, 1] = 0.0
    path = write(tmp_path / "zero.safetensors", prompt, states)
    code, out, _ = cli("verify", path, "--model", model_dir, "--device", "cpu")
    assert code == 1 and f"FAILED {path}: id {IDS[1]}: token 4 is all zeros or not finite" in out
    assert "e+" not in out and "-inf" not in out.split("per id")[0]  # no similarity of -3.6e29
