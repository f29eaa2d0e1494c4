# Sourced by scripts/demo.sh and scripts/test.sh. First, the CPU torch wheel every env installs
# (tests/requirements/torch-cpu.txt) must be in PIP_FIND_LINKS, else it says where to get it.
WHEELS=${PIP_FIND_LINKS:-/opt/wheels}
TORCH=$(sed -n 's/^torch==//p' tests/requirements/torch-cpu.txt)
if [[ "$WHEELS" != *://* ]] && ! compgen -G "$WHEELS/torch-${TORCH/+/[+]}-*.whl" > /dev/null; then
  echo "no CPU torch wheel (torch $TORCH) in $WHEELS (PIP_FIND_LINKS). Get it once from the" \
    "public PyTorch CPU index:" >&2
  echo "  pip download torch==${TORCH%+cpu} --no-deps --only-binary=:all: --python-version 3.11" \
    "--index-url https://download.pytorch.org/whl/cpu -d $WHEELS" >&2
  echo "or set PIP_FIND_LINKS to a folder that has it." >&2
  exit 2
fi
# Then .venv-tools/, this repository's own tox and uv, installed from their lock
# (tests/requirements/locks/tools.txt), never into the system python. A half-made one (an
# interrupted first run) is made again.
TOOLS=.venv-tools
if [ ! -f "$TOOLS/.complete" ]; then
  rm -rf "$TOOLS"
  python3 -m venv "$TOOLS"
  "$TOOLS/bin/python" -m pip install -q --disable-pip-version-check -r tests/requirements/locks/tools.txt
  touch "$TOOLS/.complete"
fi

