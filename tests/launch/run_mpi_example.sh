#!/usr/bin/env bash
# c4-mpi-example under Open MPI's mpirun: c4::commInitMPI on MPI_COMM_WORLD and c4CommInitMPI on a
# split communicator, each AllReduce checked against MPI_Allreduce by the program itself.
set -euo pipefail
mpirun=$1; example=$2
extra=(--oversubscribe --bind-to none)
[ "$(id -u)" -eq 0 ] && extra+=(--allow-run-as-root)
for np in 1 3 4; do
  out=$("$mpirun" -np $np "${extra[@]}" "$example" 100003 2>&1) || { echo "$out"; exit 1; }
  echo "$out"
  grep -q "c4comm over MPI: OK" <<<"$out"
  [ "$(grep -c 'matches MPI; half' <<<"$out")" -eq $np ]
done
