#!/bin/bash
# The device's compile caches, kept from one lease to the next. A cold real-size engine takes
# ~260 s to start, ~180 s of it compiling: torch.compile 54-73 s and the Triton kernels of its
# first profiling run ~110 s (2026-12-03, vLLM 0.20.1); a warm cache skips most of that.
#   on the device, after the engines ran, in a call of its own:
#     bash benchmarks/compile_cache.sh save          # -> $OUT/cache/c.tgz.partNN, 15 MiB each
#   here: copy the parts that came back into .device/cache/ (ignored with .device/)
#   on a fresh device, before the engines, once vLLM is installed:
#     bash benchmarks/compile_cache.sh restore .device/cache    # with carry=[".device/cache"]
# A cache that does not match (another vLLM, torch or model config) is simply not used.
set -uo pipefail
MAX_PARTS=3  # 45 MiB: comes back in one call, and travels beside the repository (64 MiB)
caches() {
  for d in "$HOME/.cache/vllm" "$HOME/.triton/cache" "/tmp/torchinductor_$(id -un)"; do
    [ -d "$d" ] && echo "${d#/}"
  done
}
case "${1:-}" in
  save)
    out=${OUT:-/tmp/out}/cache
    mkdir -p "$out"
    mapfile -t found < <(caches)
    [ ${#found[@]} -gt 0 ] || { echo "save: no compile cache here" >&2; exit 2; }
    (cd / && du -sh "${found[@]}")
    (cd / && tar czf - "${found[@]}") | split -b 15M -d -a 2 - "$out/c.tgz.part"
    parts=$(find "$out" -name 'c.tgz.part*' | wc -l)
    if [ "$parts" -gt "$MAX_PARTS" ]; then
      echo "save: $parts parts of 15 MiB, more than $MAX_PARTS can bring back: not saved" >&2
      rm -rf "$out"
      exit 3
    fi
    echo "compile cache saved: $parts part(s), $(du -cb "$out"/c.tgz.part* | tail -1 | cut -f1) bytes"
    ;;
  restore)
    src=${2:?usage: compile_cache.sh restore DIR}
    compgen -G "$src/c.tgz.part*" >/dev/null || { echo "restore: no c.tgz.part* in $src" >&2; exit 2; }
    cat "$src"/c.tgz.part* | tar xzf - -C / || { echo "restore: the parts do not make one archive" >&2; exit 4; }
    mapfile -t found < <(caches)
    echo "compile cache restored: $( (cd / && du -sch "${found[@]}") | tail -1 | cut -f1)"
    ;;
  *) echo "usage: compile_cache.sh save | restore DIR" >&2; exit 2 ;;
esac
