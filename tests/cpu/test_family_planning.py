"""vLLM's own KV plan for extraction from the other hybrid families, at their published sizes.

Each preset of speculators_hybrid/family_presets.py (Nemotron-H 8B/47B, Granite-4.0-H-Small,
Falcon-H1 7B/34B, Jamba-Mini-1.5, LFM2-2.6B, LFM2-8B-A1B, Zamba2-2.7B) is planned as `doctor`
plans it: vLLM's config with speculators' extraction settings (speculators' default ids, the
model's own max_model_len), the layers' specs, vLLM's planner, with the patches this release
selects. Where families.py says the family extracts on the installed vLLM:
- the hidden states are a KV-cache group of their own (one group, the extraction layer alone);
- one max-length request costs <= 1.05x the true bytes: the plan without extraction (the
  target's own KV and Mamba state, planned by vLLM) plus ids x hidden x 2 bytes per token, as
  the Qwen3.5 tests (test_own_page, test_doctor) and `doctor`'s ratio compute it.

The spare state block: vLLM's `extract_hidden_states` runs with num_speculative_tokens=1, so
every Mamba layer's spec holds one speculative state block besides its own
(`num_speculative_blocks=1`) that a prompt-only request never uses. `launch` drops it for hybrid
targets (prefill-only-extraction, its default), and that plan must meet the target. A server
that decodes keeps it (`launch --allow-decode`): at Nemotron-H's 8,192 tokens the Mamba state is
a large part of a request and the block shows (1.22x for 8B and 1.53x for 47B on vLLM 0.25.0;
Zamba2-2.7B at 4,096 tokens 1.06x); at the other presets' 128k-262k tokens it is <= 1%. The
test checks that this block is all of that plan's excess, so any other overhead fails it.
"""

from __future__ import annotations

from functools import cache

import pytest
from conftest import NO_CHUNKED_PREFILL, scratch, set_shim

from speculators_hybrid import families, planning
from speculators_hybrid.extraction import speculators_default
from speculators_hybrid.family_presets import PRESETS, write_family_config
from speculators_hybrid.registry import base_version
from speculators_hybrid.versions import installed
from speculators_hybrid.vllm_patches import prefill_only
from speculators_hybrid.vllm_patches.own_page import is_hidden

RELEASE = str(base_version(installed("vllm") or "0"))
MEMORY = 1 << 40  # planning only: more than one max-length request of any preset
TARGET = 1.05


@cache
def _dir(name: str) -> str:
    return str(write_family_config(scratch("family-") / name, name))


def _ids(name: str) -> tuple[int, ...]:
    return tuple(speculators_default(PRESETS[name]["num_hidden_layers"]))


def _plan(name: str, ids: tuple[int, ...] | None):
    """(request bytes, config, specs, KV-cache config) as the engine core plans them (prefill-only
    when SPECULATORS_HYBRID_PREFILL_ONLY is set, as `launch` sets it)."""
    setup = planning.Setup(
        model=_dir(name),
        layer_ids=ids,
        max_model_len=None,  # the model's own (as doctor plans it)
        chunked_prefill=False if NO_CHUNKED_PREFILL else None,  # 0.22-0.23 refuse it
    )
    set_shim(True)
    planning.forget_model_classes()  # the classes as the patches make them
    config = planning.engine_config(setup)
    specs = planning.layer_specs(config)
    kv = planning.plan(config, specs, MEMORY)
    return planning.max_request_bytes(config, kv), config, specs, kv


def _case(name: str):
    family = families.BY_TYPE[PRESETS[name]["model_type"]]
    skip = pytest.mark.skipif(
        not family.extracts_on(RELEASE),
        reason=f"families.py: {family.model_type} extracts from vLLM {family.first}",
    )
    return pytest.param(name, marks=skip, id=name)


@pytest.mark.full_tier  # a 27-47B-class config twice per preset: minutes per release
@pytest.mark.parametrize("name", [_case(n) for n in PRESETS])
def test_a_published_hybrid_plans_extraction_at_its_true_bytes(shim, name, monkeypatch):
    from vllm.v1.kv_cache_interface import MambaSpec

    monkeypatch.delenv(prefill_only.ENV, raising=False)
    plain, _, _, _ = _plan(name, None)
    ids = _ids(name)
    ours, config, specs, kv = _plan(name, ids)
    monkeypatch.setenv(prefill_only.ENV, "1")
    lean, _, _, _ = _plan(name, ids)
    hidden_size = PRESETS[name]["hidden_size"]
    length = config.model_config.max_model_len
    true_bytes = plain + length * len(ids) * hidden_size * 2  # bf16 hidden states

    # The hidden states: one group of their own, holding the extraction layer alone.
    layer = planning.hidden_state_layer(config)[0]
    (hidden,) = [g for g in kv.kv_cache_groups if is_hidden(g.kv_cache_spec)]
    assert hidden.layer_names == [layer]
    assert sum(layer in g.layer_names for g in kv.kv_cache_groups) == 1
    assert lean >= true_bytes * 0.99  # the hidden states are billed, not dropped

    state = [s for s in specs.values() if isinstance(s, MambaSpec)]
    spare = sum(s.num_speculative_blocks * s.page_size_bytes for s in state)
    ratio, decoding = lean / true_bytes, ours / true_bytes
    print(
        f"vLLM {RELEASE} {name}: {length:,} tokens, {lean / 2**30:.2f} GiB, {ratio:.3f}x "
        f"(a server that decodes: {decoding:.3f}x)"
    )
    assert ratio <= TARGET, (name, ratio)  # as `launch` runs it
    assert ours - spare <= lean * 1.001, (name, ours, spare, lean)  # the spare block is all


def test_doctor_plans_a_preset_from_its_config_alone(tmp_path):
    """`python -m speculators_hybrid.family_presets NAME DIR`, then `doctor DIR`: config.json
    only (no weights, no tokenizer, no network), one verdict line, exit 0."""
    import subprocess
    import sys

    name = "lfm2-2.6b" if families.BY_TYPE["lfm2"].extracts_on(RELEASE) else "nemotron-h-8b"
    folder = tmp_path / name
    made = subprocess.run(
        [sys.executable, "-m", "speculators_hybrid.family_presets", name, str(folder)],
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stderr
    assert sorted(p.name for p in folder.iterdir()) == ["config.json"]
    env = {**__import__("os").environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    cli = [sys.executable, "-m", "speculators_hybrid.cli", "doctor", str(folder)]
    done = subprocess.run(cli, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    verdicts = [line for line in done.stdout.splitlines() if line.startswith("verdict: ")]
    assert len(verdicts) == 1, done.stdout
    assert verdicts[0].startswith(
        f"verdict: hidden-state extraction works on vLLM {installed('vllm')}"
    )
