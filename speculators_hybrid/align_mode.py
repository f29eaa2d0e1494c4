"""Mamba 'align' cache mode's start-up constraint, checked before vLLM starts (`launch`, `doctor`).

With prefix caching on, vLLM caches a hybrid target's GDN/Mamba state in its 'align' mode, and
on vLLM 0.20.0-0.26.x the engine core refuses to start when the engine block size (the smallest
KV-cache group block, which the state layers make large: 800 tokens for Qwen3.6-27B) exceeds
`max_num_batched_tokens`, after the model has loaded:
`AssertionError: In Mamba cache align mode, block_size (416) must be <= max_num_batched_tokens
(256)` (`VllmConfig.validate_block_size`; 0.27.0 dropped the assertion). The block size comes
from vLLM's own planning, which depends on the model, TP, the ids and the release, so it is
computed here with vLLM's code on the CPU (planning.py, with our patches) and checked with vLLM's
own `validate_block_size`. `launch` runs `python -m speculators_hybrid.align_mode` (JSON on
stdout) in the Python that will serve, so nothing of the CPU planning reaches the server.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from dataclasses import asdict, dataclass, replace
from typing import Any

from packaging.version import Version

from speculators_hybrid import planning

# vLLM releases whose engine core asserts block_size <= max_num_batched_tokens in align mode.
CONSTRAINED = (Version("0.20"), Version("0.27"))
PLAN_MEMORY = 1 << 40  # block sizes do not depend on it; large enough for any max_model_len


@dataclass
class Check:
    mamba_cache_mode: str = ""
    block_size: int = 0  # the engine block, as the engine core sets it before validating
    max_num_batched_tokens: int = 0
    ok: bool = True
    error: str = ""  # vLLM's own assertion, one line
    smallest_valid: int = 0  # the smallest max_num_batched_tokens vLLM accepts (0: none does)

    def message(self) -> str:
        if not self.smallest_valid:
            return f"vLLM would refuse to start: {self.error} (or pass --no-enable-prefix-caching)"
        return (
            f"with prefix caching on, vLLM caches this hybrid model's state in 'align' mode with "
            f"an engine block of {self.block_size} tokens and refuses to start with "
            f"max_num_batched_tokens {self.max_num_batched_tokens}: pass "
            f"--max-num-batched-tokens {self.smallest_valid} or more (or "
            "--no-enable-prefix-caching)"
        )


def constrained(version: str | None) -> bool:
    from speculators_hybrid.registry import base_version

    if version is None:
        return False
    return CONSTRAINED[0] <= Version(str(base_version(version))) < CONSTRAINED[1]


def engine_block(kv_cache_config: Any) -> int:
    """The block size the engine core validates: the smallest of the KV-cache groups'."""
    return min(g.kv_cache_spec.block_size for g in kv_cache_config.kv_cache_groups)


def check_config(config: Any, kv_cache_config: Any) -> Check:
    """vLLM's own `validate_block_size` on a planned config, as the engine core calls it."""
    cache, scheduler = config.cache_config, config.scheduler_config
    out = Check(
        mamba_cache_mode=str(getattr(cache, "mamba_cache_mode", "none")),
        max_num_batched_tokens=int(scheduler.max_num_batched_tokens),
    )
    if not kv_cache_config.kv_cache_groups:
        return out
    out.block_size = engine_block(kv_cache_config)
    out.smallest_valid = out.max_num_batched_tokens
    if out.mamba_cache_mode != "align" or not hasattr(config, "validate_block_size"):
        return out
    cache.block_size = out.block_size
    try:
        config.validate_block_size()
    except AssertionError as exc:
        out.ok = False
        out.error = f"AssertionError: {' '.join(str(exc).split())}"
    # Our patches may put the model's own engine block back inside validate_block_size
    # (engine_block.py): the block vLLM validated is the one it left.
    out.block_size = int(cache.block_size)
    if out.ok:
        return out
    scheduler.max_num_batched_tokens = out.block_size
    try:
        config.validate_block_size()
        out.smallest_valid = out.block_size
    except AssertionError:
        out.smallest_valid = 0  # another of align mode's constraints: vLLM's error says which
    finally:
        scheduler.max_num_batched_tokens = out.max_num_batched_tokens
    return out


def check(setup: planning.Setup) -> Check:
    """Plan `setup` with vLLM's code (call `cpu.prepare()` first; the patches as the caller
    applied them) and check it. Errors from planning itself are raised as they are."""
    config = planning.engine_config(setup)
    specs = planning.layer_specs(config)
    return check_config(config, planning.plan(config, specs, PLAN_MEMORY))


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m speculators_hybrid.align_mode")
    parser.add_argument("model")
    parser.add_argument("--ids", type=int, nargs="+", required=True)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--max-model-len", type=int)
    parser.add_argument("--max-num-batched-tokens", type=int)
    parser.add_argument("--language-model-only", action="store_true")
    args = parser.parse_args(argv)
    from speculators_hybrid import cpu

    cpu.quiet_vllm(False)
    setup = planning.Setup(
        model=args.model,
        layer_ids=tuple(args.ids),
        tp=args.tp,
        prefix_caching=True,
        max_model_len=args.max_model_len,
        language_model_only=args.language_model_only,
        max_num_batched_tokens=args.max_num_batched_tokens,
    )
    try:
        with contextlib.redirect_stdout(sys.stderr):
            cpu.prepare()
            from speculators_hybrid.registry import PATCHER
            from speculators_hybrid.vllm_patches import PATCHES

            PATCHER.apply(PATCHES)
            result = check(setup)
    except Exception as exc:  # noqa: BLE001 (the caller says what to do with it)
        print(json.dumps({"planning_error": cpu.vllm_error(exc)}))
        return 1
    print(json.dumps(asdict(result)))
    return 0


def as_check(data: dict[str, Any]) -> Check:
    return replace(Check(), **{k: v for k, v in data.items() if k in Check.__dataclass_fields__})


if __name__ == "__main__":
    sys.exit(_main())
