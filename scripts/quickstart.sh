#!/usr/bin/env bash
# The main job: install, build, then AllReduce over 4 local ranks with Open MPI's figures beside.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh
python3 bench/peers/compare.py -C allreduce -np 4 -b 8 -e 64M -f 4 -d float -o sum --peers mpi
