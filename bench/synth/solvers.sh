#!/usr/bin/env bash
# Solver comparison for c4-synth's MILP (docs/c4-synth.md, "Solver comparison"): the same models as MPS
# (c4-synth --write-mps) solved by HiGHS (highspy), COIN-OR CBC (cbc) and GLPK (glpsol) under a time
# limit, one thread each. Needs scripts/synth-venv.sh and Debian's coinor-cbc and glpk-utils
# (scripts/deps.sh). Prints a markdown table; MPS files and JSON results go to bench-results/synth/.
#   bench/synth/solvers.sh [--time-limit S (60)] [--only dgx1-k4,ls8-k1,...]
#   bench/synth/solvers.sh quality [--time-limit S (240)]   c4-synth itself on DGX-1 and 8-64 host leaf-spines
#   bench/synth/solvers.sh alltoall [--time-limit S (180)]  c4-synth --coll alltoall (LP) against direct
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -x .venv-synth/bin/python ] || { echo "solvers.sh: .venv-synth is missing: run scripts/synth-venv.sh" >&2; exit 1; }
what=solvers
case "${1:-}" in quality | solvers | alltoall) what=$1; shift ;; esac
if [ "$what" = solvers ]; then
  for tool in cbc glpsol; do
    command -v "$tool" >/dev/null ||
      echo "solvers.sh: $tool is missing (apt-get install coinor-cbc glpk-utils): its column says so" >&2
  done
fi
exec .venv-synth/bin/python bench/synth/synth_bench.py "$what" "$@"
