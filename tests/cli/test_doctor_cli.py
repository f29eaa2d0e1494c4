"""`doctor` as a user runs it (subprocess; vLLM needed, so it runs in the envs of
support.CLI only, 0.20.1, 0.25.0, 0.33.0): vLLM's logs off stdout and quiet, a
legend and a one-line verdict, the demo's temporary folder removed and the preset named,
max_model_len from the model's own config (a dense Llama-like model of 131,072 positions, a
Nemotron-H-like Mamba-2 hybrid of 8,192), JSON alone on stdout. Bad input: tests/unit/test_cli.py.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from speculators_hybrid.families import BY_TYPE
from speculators_hybrid.versions import installed

MAIN_LAUNCHER = Path(__file__).resolve().parents[1] / "launchers" / "launch_vllm_main.py"

pytest.importorskip("vllm")

LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 512,
    "intermediate_size": 1024,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "num_hidden_layers": 8,
    "vocab_size": 1024,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "torch_dtype": "bfloat16",
}
NEMOTRON_H = {
    "architectures": ["NemotronHForCausalLM"],
    "model_type": "nemotron_h",
    "vocab_size": 1024,
    "hidden_size": 512,
    "intermediate_size": 1024,
    "num_hidden_layers": 8,
    "hybrid_override_pattern": "M-M*-M*-",
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "max_position_embeddings": 8192,
    "mamba_num_heads": 16,
    "mamba_head_dim": 64,
    "n_groups": 2,
    "ssm_state_size": 64,
    "conv_kernel": 4,
    "expand": 2,
    "mlp_hidden_act": "relu2",
    "torch_dtype": "bfloat16",
}


def as_a_user() -> dict[str, str]:
    """This environment without the test matrix's logging settings (tox sets the level)."""
    drop = ("VLLM_LOGGING_LEVEL", "VLLM_LOGGING_STREAM", "TRANSFORMERS_VERBOSITY")
    return {k: v for k, v in os.environ.items() if k not in drop}


def doctor(
    *args: str, tmp: Path | None = None, **variables: str
) -> subprocess.CompletedProcess[str]:
    """`speculators-hybrid doctor ARGS` as a user runs it; `tmp`: its temporary folder;
    `variables`: more environment."""
    env = as_a_user() | ({"TMPDIR": str(tmp)} if tmp else {}) | variables
    return subprocess.run(
        [sys.executable, "-m", "speculators_hybrid.cli", "doctor", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )


def config(tmp_path: Path, name: str, body: dict) -> str:
    (tmp_path / name).mkdir()
    (tmp_path / name / "config.json").write_text(json.dumps(body))
    return str(tmp_path / name)


def test_demo_report_is_quiet_explained_and_leaves_nothing_behind(tmp_path):
    # a temporary folder of its own: the matrix runs this test in two envs at once
    demos = f"{tmp_path}/spec-hybrid-demo-*"
    done = doctor("--demo", tmp=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("model the built-in qwen3.6-27b config  ids [2, 32, 61, 64]")
    assert "max_model_len 262,144" in lines[0]  # the preset's own max_position_embeddings
    assert any(line.startswith("legend: each row is `groups` KV-cache groups") for line in lines)
    assert lines[-1].startswith(
        f"verdict: hidden-state extraction works on vLLM {installed('vllm')} with "
        "speculators-hybrid: one 262,144-token request needs "
    )
    logs = ("INFO ", "WARNING ", "ERROR ", "DEBUG ")
    assert not [line for line in done.stdout.splitlines() if line.startswith(logs)]
    assert "libcuda" not in done.stderr and "Triton" not in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert glob.glob(demos) == []  # its own folder is gone


def test_real_configs_plan_at_their_own_max_model_len(tmp_path):
    done = doctor(config(tmp_path, "llama", LLAMA), "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)  # stdout is the JSON alone
    assert out["setup"]["max_model_len"] == 131072
    assert [p["ok"] for p in out["plans"]] == [True, True, True]
    assert out["bytes"]["attention_layers"] == 8 and out["bytes"]["state_layers"] == 0
    assert out["bytes"]["hidden_bytes_per_token"] == 4 * 512 * 2
    assert out["verdict"].startswith("hidden-state extraction works on vLLM ")

    nemotron = config(tmp_path, "nemotron", NEMOTRON_H)
    done = doctor(nemotron, "--json")
    first = BY_TYPE["nemotron_h"].first
    if not BY_TYPE["nemotron_h"].extracts_on(str(installed("vllm"))):
        assert done.returncode == 2 and done.stdout == ""
        assert f"the first release that has them is vLLM {first}" in done.stderr
        return
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    assert out["setup"]["max_model_len"] == 8192
    assert out["bytes"]["attention_layers"] == 2 and out["bytes"]["state_layers"] == 3
    assert out["plans"][-1]["ok"] and out["ratio_to_target"]["shim"] <= 1.05


def test_a_failed_plan_shows_vllms_error_in_one_line_and_what_to_do(tmp_path, capsys, monkeypatch):
    """In-process (the env's vLLM is imported already): a max_model_len above the model's."""
    from speculators_hybrid.cli import main

    for key in ("VLLM_LOGGING_STREAM", "VLLM_LOGGING_LEVEL", "TRANSFORMERS_VERBOSITY"):
        # unset, so doctor's defaults apply, and restored (or removed again) after the test;
        # an empty value is not unset (vLLM 0.33 cannot open a log stream named "")
        monkeypatch.setenv(key, os.environ.get(key, "unset"))
        monkeypatch.delenv(key)

    model = config(tmp_path, "llama", LLAMA)
    assert main(["doctor", model, "--max-model-len", "262144"]) == 1
    out = capsys.readouterr().out
    failures = [line for line in out.splitlines() if "vLLM start-up fails:" in line]
    assert len(failures) == 3, out
    for line in failures:
        assert "max_model_len (262144) is greater than the derived max_model_len" in line
        assert "pydantic" not in line and "input_value" not in line and "ArgsKwargs" not in line
    assert "true bytes:" not in out and "connector ;" not in out
    assert out.rstrip().endswith("Pass --max-model-len N (at most what the model allows).")

    # a --memory that one max-length request does not fit: doctor's option, not vLLM's advice
    assert main(["doctor", model, "--max-model-len", "131072", "--memory", "0.25"]) == 1
    out = capsys.readouterr().out.rstrip()
    assert out.endswith("Pass a larger --memory (GiB of KV cache) or a smaller --max-model-len.")


def test_a_config_file_stands_for_its_folder_and_an_unknown_model_type_is_one_line(tmp_path):
    done = doctor(str(Path(config(tmp_path, "llama", LLAMA)) / "config.json"), "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["setup"]["max_model_len"] == 131072

    unknown = config(tmp_path, "unknown", {**LLAMA, "model_type": "no_such_family"})
    done = doctor(unknown)
    assert done.returncode == 2 and done.stdout == "", done.stderr[-3000:]
    line = done.stderr.strip()
    assert "\n" not in line and line.startswith(
        "speculators-hybrid doctor: error: model_type 'no_such_family' is known to neither "
        "transformers "
    ), line


@pytest.mark.parametrize("launcher", ["built-in", "speculators'"])
def test_launch_refuses_an_unknown_model_type_as_doctor_does(tmp_path, launcher):
    unknown = config(tmp_path, "unknown", {**LLAMA, "model_type": "no_such_family"})
    own = ["--launcher", str(MAIN_LAUNCHER)] if launcher != "built-in" else []
    done = subprocess.run(
        [sys.executable, "-m", "speculators_hybrid.cli", "launch", *own, unknown, "--dry-run"],
        capture_output=True,
        text=True,
        timeout=600,
        env=as_a_user(),
    )
    assert done.returncode == 2 and done.stdout == "", done.stderr[-3000:]
    assert done.stderr.splitlines() == [
        "speculators-hybrid launch: error: model_type 'no_such_family' is known to neither "
        f"transformers {installed('transformers')} nor vLLM {installed('vllm')}: check "
        "config.json's model_type, or install a transformers release that has it"
    ]


def test_custom_ids_get_the_last_layer_as_launch_gives_it_and_state_bytes_are_unpadded(tmp_path):
    done = doctor("--demo", "--json", "--ids", "61", "2", "32")
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    assert out["setup"]["layer_ids"] == [2, 32, 61, 64]
    assert (
        "speculators-hybrid doctor: target layer ids [2, 32, 61, 64] (64, the last layer, "
        "added: --no-include-last-layer leaves it out)"
    ) in done.stderr
    assert out["memory_gib"] == 72  # an 80 GiB GPU at vLLM's default utilization 0.9
    # 48 Gated DeltaNet layers of the Qwen3.6-27B-like preset, from the state shapes: conv
    # state (kernel 4 - 1, + 1 row per speculative token on some releases) x (2 x 16 x 128 +
    # 48 x 128 channels) bf16, SSM state 48 heads x 128 x 128 (bf16, or float32) - not the page
    # vLLM pads them to (the attention page: 1,703,936 B a layer on vLLM 0.20.1)
    conv, ssm = 2 * 16 * 128 + 48 * 128, 48 * 128 * 128
    shapes = {rows * conv * 2 + ssm * size for rows in (3, 4) for size in (2, 4)}
    assert out["bytes"]["state_layers"] == 48
    per_layer, rest = divmod(out["bytes"]["state_bytes_per_request"], 48)
    assert rest == 0 and per_layer in shapes, per_layer

    done = doctor("--demo", "--json", "--ids", "2", "32", "61", "--no-include-last-layer")
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["setup"]["layer_ids"] == [2, 32, 61]
    assert "the last layer" not in done.stderr

    # the plugin switched off: doctor says what that means for a server and for its own plan
    off = doctor("--demo", "--json", "--ids", "61", "2", "32", SPECULATORS_HYBRID_DISABLE="1")
    assert off.returncode == 0, off.stderr[-3000:]
    assert (
        "speculators-hybrid doctor: SPECULATORS_HYBRID_DISABLE is set: a vLLM started with it "
        "runs stock (the `stock` plan); unset it for the plan a server with the plugin gets"
    ) in off.stderr.splitlines()


def test_a_patch_id_that_names_no_patch_is_refused_as_launch_refuses_it():
    done = doctor("--demo", SPECULATORS_HYBRID_DISABLED_PATCHES="no-such-patch")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [
        "speculators-hybrid doctor: error: SPECULATORS_HYBRID_DISABLED_PATCHES names no patch: "
        "no-such-patch (`speculators-hybrid patches list` with it unset shows the ids)"
    ]


def test_a_disabled_hma_patch_is_named_not_a_flag_never_passed(tmp_path):
    from speculators_hybrid.vllm_patches.hma_config import PATCH

    if not PATCH.needed_for(installed("vllm")):
        pytest.skip(f"vLLM {installed('vllm')} keeps the hybrid KV cache manager by itself")
    env = {"SPECULATORS_HYBRID_DISABLED_PATCHES": PATCH.id}
    done = subprocess.run(
        [sys.executable, "-m", "speculators_hybrid.cli", "doctor", "--demo"],
        capture_output=True,
        text=True,
        timeout=600,
        env=as_a_user() | env,
    )
    assert done.returncode == 1, done.stderr[-3000:]
    assert "remove --disable-hybrid-kv-cache-manager" not in done.stdout
    assert (
        f"SPECULATORS_HYBRID_DISABLED_PATCHES turns {PATCH.id} off, and without it vLLM turns "
        f"the manager off for the connector: take {PATCH.id} out of "
        "SPECULATORS_HYBRID_DISABLED_PATCHES"
    ) in done.stdout


def test_hidden_states_left_in_one_layer_groups_are_a_warning(tmp_path):
    """24 layers (18 Gated DeltaNet, 6 attention) group 6 wide; 2,048 is not a multiple of 6."""
    from speculators_hybrid.vllm_patches.wide_hidden import PATCH

    body = {
        "model_type": "qwen3_5_text",
        "architectures": ["Qwen3_5ForCausalLM"],
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_hidden_layers": 24,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "vocab_size": 151936,
        "layer_types": ["linear_attention"] * 3 + ["full_attention"],
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 16,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "torch_dtype": "bfloat16",
    }
    body["layer_types"] = body["layer_types"] * 6
    done = doctor(config(tmp_path, "qwen35-24", body), "--max-model-len", "8192", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout)["warnings"]
    said = [w for w in found if w.startswith("hidden size 2,048 is not divisible")]
    if PATCH.needed_for(installed("vllm")):  # the wide group's releases (caching off)
        assert said == [
            "hidden size 2,048 is not divisible by the KV-cache group width 6: the hidden states "
            "keep one layer and the plan has 25 one-layer groups instead of 5 (the same files; "
            "more scheduler work per step)."
        ], found
    else:
        assert said == [], found
