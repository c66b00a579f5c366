#!/usr/bin/env bash
# The virtual environment of the schedule synthesizer (tools/c4-synth, docs/c4-synth.md):
# .venv-synth/ (ignored by git) with PyPI's HiGHS MILP solver (highspy), numpy and pytest for its
# tests (tests/synth). Idempotent: kept when it already imports the pinned versions.
#   scripts/synth-venv.sh            (PYTHON=python3 by default: the interpreter the venv is made from)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${C4_SYNTH_VENV:-.venv-synth}
PYTHON=${PYTHON:-python3}
HIGHSPY=1.16.0
NUMPY=2.4.6
PYTEST=9.2.0
imports() {
  [ -x "$VENV/bin/python" ] && "$VENV/bin/python" - "$HIGHSPY" "$NUMPY" "$PYTEST" <<'PY' >/dev/null 2>&1
import sys
from importlib.metadata import version
import highspy, numpy, pytest  # noqa: F401
assert [version("highspy"), version("numpy"), version("pytest")] == sys.argv[1:4]
highspy.Highs()
PY
}
if imports; then
  echo "[synth-venv] $VENV has highspy $HIGHSPY, numpy $NUMPY, pytest $PYTEST"
  exit 0
fi
t0=$(date +%s)
echo "[synth-venv] making $VENV with highspy $HIGHSPY from PyPI ($PYTHON)"
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check "highspy==$HIGHSPY" "numpy==$NUMPY" "pytest==$PYTEST"
if ! imports; then
  echo "[synth-venv] FAIL: highspy $HIGHSPY / numpy $NUMPY / pytest $PYTEST do not import in $VENV" >&2
  exit 1
fi
echo "[synth-venv] $VENV ready: $(du -sh "$VENV" | cut -f1), $(($(date +%s) - t0)) s"
