#!/usr/bin/env bash
# The registered-buffer sweeps behind docs/performance.md ("Registered buffers"): every library
# allocates its own buffers (-R 1: c4 with ncclMemAlloc, so calls run on the zero-copy path;
# Open MPI with MPI_Alloc_mem). Run by bench/report.sh; alone: bench/report_registered.sh [quick].
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench-results}
mkdir -p "$OUT"
REP=${REP:-5}; ITERS=20
[ "${1:-}" = quick ] && REP=1 && ITERS=5
SMALL_ITERS=$((ITERS * 10))
cmp() { python3 bench/peers/compare.py --repeat "$REP" --peers mpi -R 1 "$@"; }
step() { echo; echo "=== $*"; }

step "Registered buffers: AllReduce float sum, 2 ranks, 64 KiB .. 64 MiB"
cmp -C allreduce -np 2 -b 64K -e 4M -f 2 -n $SMALL_ITERS -w 20 \
  --csv "$OUT/allreduce_np2_reg_small.csv" | tee "$OUT/allreduce_np2_reg_small.txt"
cmp -C allreduce -np 2 -b 8M -e 64M -f 2 -n $ITERS -w 3 \
  --plot "$OUT/allreduce_np2_reg.svg" --csv "$OUT/allreduce_np2_reg.csv" | tee "$OUT/allreduce_np2_reg.txt"
for np in 2 4; do
  for c in allgather broadcast reducescatter; do
    step "Registered buffers: $c float, $np ranks, 64 KiB .. 64 MiB"
    cmp -C $c -np $np -b 64K -e 1M -f 4 -n $SMALL_ITERS -w 20 \
      --csv "$OUT/${c}_np${np}_reg_small.csv" | tee "$OUT/${c}_np${np}_reg_small.txt"
    cmp -C $c -np $np -b 4M -e 64M -f 4 -n $ITERS -w 3 \
      --plot "$OUT/${c}_np${np}_reg.svg" --csv "$OUT/${c}_np${np}_reg.csv" | tee "$OUT/${c}_np${np}_reg.txt"
  done
done
