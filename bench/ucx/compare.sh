#!/usr/bin/env bash
# The ucx transport beside UCX's own ucx_perftest, same machine, same run, same UCX
# transports (UCX_TLS):
#   1. one-way point-to-point bandwidth at SIZE: ucx_perftest tag_bw vs c4-p2p-bw over C4_TRANSPORT=ucx;
#   2. AllReduce over ucx vs over c4's own tcp transport (c4-perf -np 2, 1-64 MiB, in pairs).
#
#   bench/ucx/compare.sh [BUILD_DIR=build] [SIZE=4M] [UCX_TLS=tcp,self] [REPEAT=3]
# UCX_TLS "default" leaves it unset: UCX's own choice (shared memory and cma between two processes of
# one host). Like is compared with like: C4_UCX_PEER_FAILURE=2 asks UCX for peer-failure handling on
# every endpoint and is compared with ucx_perftest -e (endpoints with error handling, the same UCX
# protocols); the default (1: a peer on this host is watched as a process, UCX handles nothing) and 0
# with plain ucx_perftest. UCX 1.13 offers peer-failure handling over tcp (and verbs) but not over
# shared memory: with UCX_TLS=tcp,self all of them run on one UCX transport.
# Each side's two processes run pinned to CPUs 0 and 1 (taskset; C4_P2P_PIN=1): unpinned pairs on
# this 2-core VM swing 2x with the scheduler's placement, pinned ones by a few percent.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build}
SIZE=${2:-4M}
TLS=${3:-tcp,self}
REPEAT=${4:-3}
command -v ucx_perftest > /dev/null || { echo "compare.sh: ucx_perftest not found (apt install ucx-utils)"; exit 2; }
bytes=$(numfmt --from=iec "$SIZE")
export C4_TRACE=0
if [ "$TLS" = default ]; then unset UCX_TLS; else export UCX_TLS="$TLS"; fi
port=$((20000 + RANDOM % 20000))
echo "# UCX_TLS=$TLS, $SIZE messages, 200 per run after 20 warm-up; MB = 2^20 B"
perftest() {  # perftest [-e]: MB/s of ucx_perftest tag_bw, server on CPU 0 and client on CPU 1
  local port=$((20000 + RANDOM % 20000))
  taskset -c 0 timeout 120 ucx_perftest -t tag_bw -s "$bytes" -n 200 -w 20 -p "$port" "$@" > /dev/null 2>&1 &
  local srv=$!
  sleep 0.5
  taskset -c 1 timeout 120 ucx_perftest 127.0.0.1 -t tag_bw -s "$bytes" -n 200 -w 20 -p "$port" "$@" -f 2>/dev/null |
    awk '$1 == 200 {print $6}'
  wait "$srv" || true
}
ours() {  # ours PEER_FAILURE: MB/s of c4-p2p-bw over ucx, rank r on CPU r
  C4_TRANSPORT=ucx C4_UCX_PEER_FAILURE=$1 C4_P2P_PIN=1 timeout 120 "$BUILD/bin/c4-p2p-bw" "$SIZE" 200 16 20 |
    awk '{print $(NF-7)}'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.3f", a/b}'; }
for k in $(seq "$REPEAT"); do
  pe=$(perftest -e)
  c2=$(ours 2)
  p0=$(perftest)
  c1=$(ours 1)
  c0=$(ours 0)
  echo "run $k: UCX handles peer failure: ucx_perftest -e $pe MB/s, c4 (C4_UCX_PEER_FAILURE=2) $c2 MB/s" \
       "(ratio $(ratio "$c2" "$pe")); it does not: ucx_perftest $p0 MB/s, c4 (default) $c1 MB/s (ratio" \
       "$(ratio "$c1" "$p0")), c4 (C4_UCX_PEER_FAILURE=0) $c0 MB/s (ratio $(ratio "$c0" "$p0"))"
done
# AllReduce, 2 ranks, busbw GB/s out of place: per size, c4's tcp transport then c4 over ucx (the
# default mode) back to back, REPEAT rounds. This VM switches between a fast and a slow state
# between runs, so a ratio is read within a pair; printed: every pair, then per size the median of
# the pairs' ratios and their range.
echo "# AllReduce, 2 ranks: c4 over ucx / c4 over its tcp transport (busbw GB/s, out of place; pairs back to back)"
busbw() {  # busbw TRANSPORT SIZE
  C4_TRANSPORT=$1 timeout 300 "$BUILD/bin/c4-perf" -np 2 -C allreduce -b "$2" -e "$2" -n 20 -w 3 |
    awk '$1 ~ /^[0-9]+$/ {print $7; exit}'
}
pairs=$(mktemp)
for k in $(seq "$REPEAT"); do
  for size in 1M 4M 16M 64M; do
    tcp=$(busbw tcp "$size")
    ucx=$(busbw ucx "$size")
    echo "round $k, $size: tcp $tcp, ucx $ucx (ratio $(ratio "$ucx" "$tcp"))"
    echo "$size $(ratio "$ucx" "$tcp")" >> "$pairs"
  done
done
for size in 1M 4M 16M 64M; do
  awk -v s="$size" '$1 == s {print $2}' "$pairs" | sort -g |
    awk -v s="$size" '{r[NR] = $1} END {m = NR % 2 ? r[(NR + 1) / 2] : (r[NR / 2] + r[NR / 2 + 1]) / 2;
      printf "%s: ucx / tcp median of %d pairs %.2f (%.2f-%.2f)\n", s, NR, m, r[1], r[NR]}'
done
rm -f "$pairs"
