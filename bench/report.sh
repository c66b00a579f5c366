#!/usr/bin/env bash
# Runs every measurement behind docs/performance.md, c4 beside its peers in the same run, and
# writes the raw outputs plus SVG charts to ${OUT:-bench-results}/. Libraries take turns
# (--repeat), and each size reports the median, because this VM's speed drifts over minutes.
# Usage: bench/report.sh [quick]   (quick: fewer repeats and sizes, for a smoke run)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench-results}
mkdir -p "$OUT"
REP=${REP:-5}; ITERS=20
[ "${1:-}" = quick ] && REP=1 && ITERS=5
cmp() { python3 bench/peers/compare.py --repeat "$REP" "$@"; }
step() { echo; echo "=== $*"; }

# Sizes that take microseconds need many iterations to rise above scheduling noise: each sweep is
# split, small sizes with 10x the iterations (the same flags go to every library).
SMALL_ITERS=$((ITERS * 10))

step "AllReduce float sum, 2 ranks, 1 MiB .. 64 MiB (busbw, c4 vs Open MPI and Gloo)"
cmp -C allreduce -np 2 -b 1M -e 4M -f 2 -d float -o sum -n $SMALL_ITERS -w 20 --peers mpi,gloo \
  --csv "$OUT/allreduce_np2_small.csv" | tee "$OUT/allreduce_np2_small.txt"
cmp -C allreduce -np 2 -b 8M -e 64M -f 2 -d float -o sum -n $ITERS -w 3 --peers mpi,gloo \
  --plot "$OUT/allreduce_np2.svg" --csv "$OUT/allreduce_np2.csv" | tee "$OUT/allreduce_np2.txt"

step "AllReduce 8 B latency, 2 ranks"
cmp -C allreduce -np 2 -b 8 -e 8 -d float -o sum -n 20000 -w 1000 --peers mpi | tee "$OUT/latency_np2.txt"

for np in 2 4; do
  for c in allgather broadcast reducescatter; do
    step "$c float, $np ranks, 64 KiB .. 64 MiB"
    cmp -C $c -np $np -b 64K -e 1M -f 4 -d float -o sum -n $SMALL_ITERS -w 20 --peers mpi \
      --csv "$OUT/${c}_np${np}_small.csv" | tee "$OUT/${c}_np${np}_small.txt"
    cmp -C $c -np $np -b 4M -e 64M -f 4 -d float -o sum -n $ITERS -w 3 --peers mpi \
      --plot "$OUT/${c}_np$np.svg" --csv "$OUT/${c}_np$np.csv" | tee "$OUT/${c}_np$np.txt"
  done
done

OUT="$OUT" REP="$REP" bench/report_registered.sh ${1:-}

step "AllReduce over tcp on loopback, 2 ranks (c4 C4_TRANSPORT=tcp vs Gloo's TCP and Open MPI's tcp BTL)"
C4_TRANSPORT=tcp C4_MPIRUN_ARGS="--mca btl tcp,self --mca btl_tcp_if_include lo" \
  cmp -C allreduce -np 2 -b 1M -e 64M -f 4 -d float -o sum -n $ITERS -w 3 --peers mpi,gloo \
  --plot "$OUT/allreduce_tcp_np2.svg" --csv "$OUT/allreduce_tcp_np2.csv" | tee "$OUT/allreduce_tcp_np2.txt"

step "AllReduce across emulated hosts (netlab, 1 Gbit/s links; needs root): 1 port vs 2 ports, beside Gloo and Open MPI"
if [ "$(id -u)" -eq 0 ]; then
  OUT="$OUT" bench/netlab/netlab_bench.sh 1gbit 64M | grep -v '^\[netlab\]' || echo "(netlab bench failed)"
else
  echo "(skipped: netlab needs root)"
fi

step "Communicator init time vs ranks (c4-perf -np N, 8-byte AllReduce)"
for np in 2 4 8 16 32 64; do
  best=""
  for r in 1 2 3; do
    t=$(build/bin/c4-perf -np $np -C allreduce -b 8 -e 8 -n 5 -w 1 | sed -n 's/^# Init time: \([0-9.]*\) ms.*/\1/p')
    best=$(python3 -c "print(min(x for x in [$t${best:+, $best}]))")
  done
  echo "ranks $np  init ${best} ms (best of 3)"
done | tee "$OUT/init.txt"

step "Host reduction kernels vs memory bandwidth (256 MiB arrays)"
build/bin/c4-kernels-bench --benchmark_min_time=0.2 --benchmark_filter='256MiB' 2>/dev/null \
  | tee "$OUT/kernels.txt" || echo "(c4-kernels-bench not built)"
echo; echo "results in $OUT/"
