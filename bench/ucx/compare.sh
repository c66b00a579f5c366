#!/usr/bin/env bash
# The ucx transport beside UCX's own ucx_perftest (issue 18), same machine, same run, same UCX
# transports (UCX_TLS):
#   1. one-way point-to-point bandwidth at SIZE: ucx_perftest tag_bw vs c4-p2p-bw over C4_TRANSPORT=ucx;
#   2. AllReduce over ucx vs over c4's own tcp transport (c4-perf -np 2, 1-64 MiB).
#
#   bench/ucx/compare.sh [BUILD_DIR=build] [SIZE=4M] [UCX_TLS=tcp,self] [REPEAT=3]
# With C4_UCX_PEER_FAILURE=1 (the default) the transport asks UCX for peer-failure handling, which
# ucx_perftest does not; UCX 1.13 offers it over tcp (and verbs) but not over shared memory, so
# UCX_TLS=tcp,self keeps both on the same UCX transport. Both modes are measured.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build}
SIZE=${2:-4M}
TLS=${3:-tcp,self}
REPEAT=${4:-3}
command -v ucx_perftest > /dev/null || { echo "compare.sh: ucx_perftest not found (apt install ucx-utils)"; exit 2; }
bytes=$(numfmt --from=iec "$SIZE")
export C4_TRACE=0 UCX_TLS="$TLS"
port=$((20000 + RANDOM % 20000))
echo "# UCX_TLS=$TLS, $SIZE messages, 200 per run after 20 warm-up; MB = 2^20 B"
for k in $(seq "$REPEAT"); do
  timeout 120 ucx_perftest -t tag_bw -s "$bytes" -n 200 -w 20 -p "$port" > /dev/null 2>&1 &
  srv=$!
  sleep 0.5
  theirs=$(timeout 120 ucx_perftest 127.0.0.1 -t tag_bw -s "$bytes" -n 200 -w 20 -p "$port" -f 2>/dev/null |
           awk '$1 == 200 {print $6}')
  wait "$srv" || true
  ours=$(C4_TRANSPORT=ucx timeout 120 "$BUILD/bin/c4-p2p-bw" "$SIZE" 200 16 20 | awk '{print $(NF-7)}')
  fast=$(C4_TRANSPORT=ucx C4_UCX_PEER_FAILURE=0 timeout 120 "$BUILD/bin/c4-p2p-bw" "$SIZE" 200 16 20 |
         awk '{print $(NF-7)}')
  ratio() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.3f", a/b}'; }
  echo "run $k: ucx_perftest tag_bw $theirs MB/s; c4 over ucx $ours MB/s (ratio $(ratio "$ours" "$theirs")), with" \
       "C4_UCX_PEER_FAILURE=0 $fast MB/s (ratio $(ratio "$fast" "$theirs"))"
done
echo "# AllReduce, 2 ranks: c4 over ucx vs c4 over its tcp transport (busbw GB/s, out of place)"
for cfg in "ucx 1" "ucx 0" "tcp 1"; do
  set -- $cfg
  echo "## C4_TRANSPORT=$1 C4_UCX_PEER_FAILURE=$2"
  C4_TRANSPORT=$1 C4_UCX_PEER_FAILURE=$2 timeout 300 "$BUILD/bin/c4-perf" -np 2 -C allreduce -b 1M -e 64M -f 4 \
    -n 20 -w 3 | grep -E "^ +[0-9]"
done
