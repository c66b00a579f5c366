#!/usr/bin/env bash
# c4-perf started by Open MPI's mpirun: ranks come from OMPI_COMM_WORLD_* (commInitFromEnv).
set -euo pipefail
mpirun=$1; perf=$2
extra=(--oversubscribe --bind-to none)
[ "$(id -u)" -eq 0 ] && extra+=(--allow-run-as-root)
out=$("$mpirun" -np 3 "${extra[@]}" "$perf" -C allreduce -b 8 -e 1M -f 32 -c 1 -n 2 -w 1 2>&1) || { echo "$out"; exit 1; }
echo "$out"
grep -q "Out of bounds values : 0 OK" <<<"$out"
# One header line per rank proves the three processes formed one communicator.
[ "$(grep -c '^#  Rank' <<<"$out")" -eq 3 ]
