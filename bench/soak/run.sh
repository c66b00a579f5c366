#!/usr/bin/env bash
# The long soak: mixed random collectives on 2-4 ranks over shm and tcp, every result
# checked, for DURATION_SECONDS; fails on a wrong result, a leak or a hang (docs/soak.md).
#
#   bench/soak/run.sh DURATION_SECONDS [BUILD_DIR]      e.g. bench/soak/run.sh 1800
#
# Extra c4-soak options pass through C4_SOAK_ARGS (e.g. C4_SOAK_ARGS="--seed 42 --max-bytes 1M").
# Writes soak-<date>.json (and soak-<date>.png, or .svg without matplotlib) into
# ${C4_SOAK_OUT:-bench-results/soak}. Exit status 0 only when the soak passed.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ $# -lt 1 ]; then
  sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
DURATION=$1
BUILD_DIR=${2:-build}
BIN="$BUILD_DIR/bin/c4-soak"
if [ ! -x "$BIN" ]; then
  echo "run.sh: $BIN not found; build it first: cmake --build $BUILD_DIR --target c4-soak" >&2
  exit 2
fi
OUT=${C4_SOAK_OUT:-bench-results/soak}
mkdir -p "$OUT"
STAMP=$(date +%Y%m%d-%H%M%S)
JSON="$OUT/soak-$STAMP.json"
# shellcheck disable=SC2086  # C4_SOAK_ARGS is a list of options
set +e
"$BIN" --duration "$DURATION" --json "$JSON" ${C4_SOAK_ARGS:-}
rc=$?
set -e
if [ -f "$JSON" ]; then
  # The plot is a bonus: its failure never changes the verdict.
  PY=${PYTHON:-/usr/bin/python3}
  [ -x "$PY" ] || PY=python3
  "$PY" bench/soak/plot.py "$JSON" -o "$OUT/soak-$STAMP" || echo "run.sh: no plot (bench/soak/plot.py failed)" >&2
  echo "run.sh: summary in $JSON"
fi
if [ $rc -eq 0 ]; then
  echo "run.sh: soak of ${DURATION} s PASSED"
else
  echo "run.sh: soak of ${DURATION} s FAILED (exit $rc)" >&2
fi
exit $rc
