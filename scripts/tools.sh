# Sourced by scripts/demo.sh and scripts/test.sh: .venv-tools/, this repository's own tox and uv,
# installed from their lock (tests/requirements/locks/tools.txt), never into the system python.
# A half-made one (an interrupted first run) is made again.
TOOLS=.venv-tools
if [ ! -f "$TOOLS/.complete" ]; then
  rm -rf "$TOOLS"
  python3 -m venv "$TOOLS"
  "$TOOLS/bin/python" -m pip install -q --disable-pip-version-check -r tests/requirements/locks/tools.txt
  touch "$TOOLS/.complete"
fi
