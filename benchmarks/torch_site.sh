#!/bin/bash
# Device side of benchmarks/stage_torch.py (carried as .device/bin/torch-site.sh). Subcommands:
#   park           copy the parts and manifest this call carried into $TORCH_STAGE
#   unpack         check every part's SHA-256, join them, check every wheel's SHA-256
#   install        unpack, then install the wheels into $TORCH_STAGE/site, link the image's NVIDIA
#                  libraries that did not travel into it, and check `import torch` there
#   vllm-install   on-device.sh install (vLLM in /tmp/stash/site), checked with this torch
#   run CMD...     run CMD with $TORCH_STAGE/site before the image's site-packages
# The image's own torch is left as it is. $TORCH_STAGE (default /tmp/torch-stage) lies outside
# /tmp/stash, so restaging vLLM (rm -rf /tmp/stash) keeps the staged torch.
set -o pipefail
export PYTHONUNBUFFERED=1
ST=${TORCH_STAGE:-/tmp/torch-stage}; SITE=$ST/site; D=$PWD/.device
die() { echo "torch-site: $1" >&2; exit "${2:-1}"; }
mkdir -p "$ST/parts"

unpack() {
  [ -f "$ST/parts.sha256" ] || die "nothing parked: the machine was given back; start again with the first call" 9
  local missing
  missing=$(cd "$ST/parts" && awk '{print $2}' "$ST/parts.sha256" | while read -r p; do [ -f "$p" ] || echo "$p"; done)
  [ -z "$missing" ] || die "parts missing: $(echo $missing): make their park calls, then install again" 10
  (cd "$ST/parts" && sha256sum -c --quiet "$ST/parts.sha256") || die "a part is corrupt (above): park it again" 11
  rm -rf "$ST/wheels"; mkdir -p "$ST/wheels"
  awk '{print $2}' "$ST/parts.sha256" | (cd "$ST/parts" && xargs cat) | tar -x -C "$ST/wheels" \
    || die "the parts do not make one archive" 12
  (cd "$ST/wheels" && sha256sum -c --quiet "$ST/wheels.sha256") || die "a wheel is corrupt after joining" 13
  echo "unpacked: $(ls "$ST/wheels" | wc -l) wheels, $(du -sb "$ST/wheels" | cut -f1) bytes"
}

# Each entry of the image's nvidia/ tree that the staged site lacks becomes a link there, so the
# staged torch's RPATH ($ORIGIN/../../nvidia/...) finds every library in one place.
link_image_libs() {
  env -u PYTHONPATH python3 - "$SITE" <<'EOF'
import importlib.util, os, sys
from pathlib import Path
spec = importlib.util.find_spec("torch")
image = Path(spec.origin).parents[1] / "nvidia" if spec and spec.origin else None
def link(src, dst):
    n = 0
    for entry in src.iterdir():
        target = dst / entry.name
        if not target.exists() and not target.is_symlink():
            target.symlink_to(entry); n += 1
        elif entry.is_dir() and target.is_dir() and not target.is_symlink():
            n += link(entry, target)
    return n
if image is None or not image.is_dir():
    print("torch-site: the image has no nvidia/ beside its torch; nothing linked")
else:
    (Path(sys.argv[1]) / "nvidia").mkdir(exist_ok=True)
    print(f"linked {link(image, Path(sys.argv[1]) / 'nvidia')} entries of {image}")
EOF
}

check() {
  PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH} python3 - "$ST" <<'EOF'
import importlib.metadata as md, sys
from pathlib import Path
st = Path(sys.argv[1])
want = (st / "TORCH_VERSION").read_text().strip()
bad = []
for line in (st / "needs.txt").read_text().splitlines():
    name, _, spec = line.partition(" ")
    try:
        have = md.version(name)
    except md.PackageNotFoundError:
        bad.append(f"{name} missing"); continue
    try:
        from packaging.specifiers import SpecifierSet
        if spec and not SpecifierSet(spec).contains(have, prereleases=True):
            bad.append(f"{name} {have} not {spec}")
    except ImportError:
        pass
import torch
print("torch", torch.__version__, "from", Path(torch.__file__).parent, "cuda", torch.version.cuda,
      "available", torch.cuda.is_available())
if torch.cuda.is_available():
    x = torch.randn(256, 256, device="cuda")
    print("matmul sum", float((x @ x).sum()), "cudnn", torch.backends.cudnn.version(),
          "nccl", torch.cuda.nccl.version(), "on", torch.cuda.get_device_name())
maps = {p for p in open("/proc/self/maps").read().split() if "/nvidia/" in p and ".so" in p}
staged = sorted(Path(p).name for p in maps if p.startswith(str(st)))
print("NVIDIA libraries loaded, staged:", *staged, "| the image's:", *sorted(Path(p).name for p in maps
      if not p.startswith(str(st))))
import triton
print("triton", triton.__version__, "from", Path(triton.__file__).parent)
if bad:  # the image's libraries are not the set this staging assumed: restage with these added
    print("torch-site: installed, but these requirements are not met:", *bad, sep="\n  ")
if torch.__version__.split("+")[0] != want or bad:
    sys.exit(f"torch-site: wanted torch {want}, got {torch.__version__}")
EOF
}

case "${1:-}" in
  park)
    [ -d "$D/torch" ] && cp "$D"/torch/* "$ST/"
    for f in "$D"/torch-parts/t[0-9]*; do
      [ -f "$f" ] || continue
      cp "$f" "$ST/parts/"
      # a part that came corrupt is named now, while its call can simply be made again
      (cd "$ST/parts" && grep " ${f##*/}\$" "$ST/parts.sha256" | sha256sum -c --quiet -) \
        || { rm -f "$ST/parts/${f##*/}"; die "${f##*/} is corrupt or unknown (no parts.sha256 yet?): make this call again" 11; }
    done
    echo "parked: $(ls "$ST/parts" | wc -l) of $(wc -l < "$ST/parts.sha256" 2>/dev/null || echo '?') parts"
    ;;
  unpack) unpack ;;
  install)
    t0=$SECONDS
    unpack || exit $?
    t1=$SECONDS
    rm -rf "$ST/parts" "$SITE"
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$ST"/wheels/*.whl 2>&1 \
      | grep -v -i warning | tail -3
    [ -d "$SITE/torch" ] || die "pip did not install torch into $SITE" 14
    rm -rf "$ST/wheels"
    link_image_libs
    t2=$SECONDS
    check || exit 15
    echo "install seconds: unpack $((t1 - t0)), pip and links $((t2 - t1)), check $((SECONDS - t2))"
    echo "image's torch untouched: $(env -u PYTHONPATH python3 -c 'import importlib.metadata as m; print(m.version("torch"))')"
    ;;
  check) check ;;
  vllm-install)
    # on-device.sh checks its install with PYTHONPATH set to vLLM's site alone (the image's torch),
    # so its own check is not the one that counts here.
    bash "$D/bin/on-device.sh" install
    [ -f /tmp/stash/site/vllm/__init__.py ] || die "vLLM is not installed (on-device.sh install above)" 16
    PYTHONPATH=/tmp/stash/site:$SITE python3 -c "import vllm, torch; print('with this torch: vllm', vllm.__version__, 'torch', torch.__version__, 'cuda', torch.cuda.is_available())"
    ;;
  run)
    shift
    [ -d "$SITE/torch" ] || die "no staged torch here; the machine was given back: start again" 9
    export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
    exec "$@"
    ;;
  *) die "usage: torch-site.sh park|unpack|install|check|vllm-install|run CMD..." 2 ;;
esac
